internal import CSodium
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// libsodium must be initialised before any of its functions run; a lazy static
/// gives us exactly-once, thread-safe initialisation.
enum SodiumRuntime {
    static let ready: Bool = {
        // 0 = initialised now, 1 = already initialised, -1 = unusable.
        if sodium_init() < 0 {
            fatalError("libsodium failed to initialise; no cryptography is possible")
        }
        return true
    }()

    @inline(__always)
    static func ensure() {
        _ = ready
    }
}

/// Secret bytes kept off the Swift heap: on `sodium_malloc` memory, which is
/// locked (never swapped), fenced by guard pages, and wiped when released.
///
/// The bytes sit at the very end of their region, so reading or writing one
/// byte past `count` hits the guard page and traps.
///
/// The class is `Sendable` because the storage never moves; callers that mutate
/// it through `withUnsafeMutableBytes` must not do so from two threads at once.
public final class SecureBytes: @unchecked Sendable {
    /// Start of the sodium_malloc region (what sodium_free wants).
    private let region: UnsafeMutableRawPointer
    /// Start of our bytes: region + regionSize - count.
    private let start: UnsafeMutableRawPointer
    /// Index into RegionPool.sizes, or -1 for a region sized exactly for us.
    private let sizeClass: Int
    public let count: Int

    /// Storage whose contents the caller promises to fill completely.
    init(uninitializedCount count: Int) {
        precondition(count >= 0, "SecureBytes count must not be negative")
        SodiumRuntime.ensure()
        if let sizeClass = RegionPool.sizeClass(for: count) {
            region = RegionPool.shared.acquire(sizeClass)
            start = region + (RegionPool.sizes[sizeClass] - count)
            self.sizeClass = sizeClass
        } else {
            guard let pointer = sodium_malloc(count) else {
                fatalError("sodium_malloc(\(count)) failed: out of memory")
            }
            region = pointer
            start = pointer
            sizeClass = -1
        }
        self.count = count
    }

    /// `count` zero bytes.
    public convenience init(count: Int) {
        self.init(uninitializedCount: count)
        sodium_memzero(start, count)
    }

    /// `count` bytes from the system's secure random source.
    public convenience init(random count: Int) {
        self.init(uninitializedCount: count)
        randombytes_buf(start, count)
    }

    /// A copy of `bytes`. The source is left as it is: wipe it yourself if it
    /// held a secret.
    public convenience init(copying bytes: some Collection<UInt8>) {
        let n = bytes.count
        self.init(uninitializedCount: n)
        let destination = start
        let copied: Bool? = bytes.withContiguousStorageIfAvailable { source in
            if let address = source.baseAddress, n > 0 {
                destination.copyMemory(from: address, byteCount: n)
            }
            return true
        }
        if copied == nil {
            var offset = 0
            for byte in bytes {
                destination.storeBytes(of: byte, toByteOffset: offset, as: UInt8.self)
                offset += 1
            }
        }
    }

    deinit {
        if sizeClass >= 0 {
            RegionPool.shared.release(region, sizeClass)  // Wipes it.
        } else {
            sodium_free(region)  // Wipes before unmapping.
        }
    }

    public func withUnsafeBytes<R, E: Error>(
        _ body: (UnsafeRawBufferPointer) throws(E) -> R
    ) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: start, count: count))
    }

    public func withUnsafeMutableBytes<R, E: Error>(
        _ body: (UnsafeMutableRawBufferPointer) throws(E) -> R
    ) throws(E) -> R {
        try body(UnsafeMutableRawBufferPointer(start: start, count: count))
    }

    /// Raw start address for this module's C calls; never nil, even for count 0.
    var pointer: UnsafeMutableRawPointer { start }
}

/// sodium_malloc and sodium_free cost about ten system calls between them
/// (mmap, mprotect, mlock, madvise and their undoing): ~24 µs on our VMs, more
/// than a whole warm keychain read. So small regions are recycled: wiped on
/// release, then handed out again still locked and guarded.
final class RegionPool: Sendable {
    static let shared = RegionPool()
    /// Region sizes; a request uses the smallest that fits.
    static let sizes = [32, 64, 128, 256, 512, 1024, 2048]
    /// Bounds the locked memory held idle: at most 7 x 32 regions of one page each.
    static let keptPerSize = 32

    /// The addresses of the idle regions of each size class (addresses, not pointers: a pointer is not
    /// `Sendable`, so it cannot go into a `Mutex`'s value).
    private let free: Mutex<[[UInt]]>

    private init() {
        free = Mutex(Self.sizes.map { _ in
            var list: [UInt] = []
            list.reserveCapacity(Self.keptPerSize)  // No allocation under the lock later.
            return list
        })
    }

    @inline(__always)
    static func sizeClass(for count: Int) -> Int? {
        if count <= 32 { return 0 }
        let index = (Int.bitWidth - (count - 1).leadingZeroBitCount) - 5
        return index < sizes.count ? index : nil
    }

    func acquire(_ sizeClass: Int) -> UnsafeMutableRawPointer {
        if let reused = free.withLock({ $0[sizeClass].popLast() }), let region = UnsafeMutableRawPointer(bitPattern: reused) {
            return region
        }
        guard let fresh = sodium_malloc(Self.sizes[sizeClass]) else {
            fatalError("sodium_malloc(\(Self.sizes[sizeClass])) failed: out of memory")
        }
        return fresh
    }

    func release(_ region: UnsafeMutableRawPointer, _ sizeClass: Int) {
        sodium_memzero(region, Self.sizes[sizeClass])
        let kept = free.withLock { free in
            guard free[sizeClass].count < Self.keptPerSize else { return false }
            free[sizeClass].append(UInt(bitPattern: region))
            return true
        }
        if !kept { sodium_free(region) }
    }
}

extension SecureBytes: Equatable {
    /// Constant time in the contents; lengths are not treated as secret.
    public static func == (lhs: SecureBytes, rhs: SecureBytes) -> Bool {
        if lhs === rhs { return true }
        guard lhs.count == rhs.count else { return false }
        return sodium_memcmp(lhs.start, rhs.start, lhs.count) == 0
    }
}

// Printing, debugging and dump() must never reveal the contents.
extension SecureBytes: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public var description: String { "SecureBytes(\(count) bytes)" }
    public var debugDescription: String { description }
    public var customMirror: Mirror { Mirror(self, children: ["count": count]) }
}
