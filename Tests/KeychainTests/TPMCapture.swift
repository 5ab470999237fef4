import Foundation
import TPM2

/// The TPM commands and responses of a capture made by tpm2-tss's pcap TCTI (pcapng, raw IPv4 and
/// TCP frames to and from port 2321), decoded as far as the session checks of the capture tests need.
struct TPMCapture {
    struct Session {
        let handle: UInt32
        /// Whether the session is salted (TPM2_StartAuthSession with a tpmKey and an encrypted salt).
        let saltedWith: UInt32?
        var isSalted: Bool { saltedWith != nil }
    }

    struct Authorization {
        let handle: UInt32
        let attributes: UInt8
        var decrypts: Bool { attributes & 0x20 != 0 }
        var encrypts: Bool { attributes & 0x40 != 0 }
    }

    struct Command {
        let code: UInt32
        let handles: [UInt32]
        let authorizations: [Authorization]
        /// The sessions the authorizations name, as they were started (nil for a password session).
        let sessions: [Session?]
        let response: UInt32
    }

    /// Handles each command carries before its parameters (TPM 2.0 Part 3), for the commands we decode.
    static let handleCounts: [UInt32: Int] = [
        CommandCode.startAuthSession: 2, CommandCode.policySecret: 2, CommandCode.nvChangeAuth: 1,
        CommandCode.unseal: 1, CommandCode.nvWrite: 2, Self.load: 1, Self.create: 1,
    ]
    static let load: UInt32 = 0x157, create: UInt32 = 0x153

    private(set) var commands: [Command] = []
    /// The code of every command sent to the TPM, decoded or not, in order.
    private(set) var codes: [UInt32] = []

    init(path: String) throws {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
        var sessions: [UInt32: Session] = [:]
        var pending: (code: UInt32, handles: [UInt32], auths: [Authorization], salt: UInt32?)?
        for (toTPM, payload) in Self.tcpPayloads(bytes) where payload.count >= 10 {
            var reader = Reader(payload)
            let tag = reader.u16(), size = Int(reader.u32()), code = reader.u32()
            guard size == payload.count else { throw CaptureError("a TPM message split across frames") }
            if toTPM {
                codes.append(code)
                let handles = (0..<(Self.handleCounts[code] ?? 0)).map { _ in reader.u32() }
                var auths: [Authorization] = []
                if tag == 0x8002, Self.handleCounts[code] != nil {
                    let end = reader.offset + 4 + Int(reader.u32())
                    while reader.offset < end {
                        let handle = reader.u32()
                        _ = reader.sized()
                        let attributes = reader.u8()
                        _ = reader.sized()
                        auths.append(Authorization(handle: handle, attributes: attributes))
                    }
                }
                var salt: UInt32?
                if code == CommandCode.startAuthSession {
                    _ = reader.sized()  // nonceCaller
                    let encryptedSalt = reader.sized()
                    if handles[0] != 0x4000_0007 && !encryptedSalt.isEmpty { salt = handles[0] }
                }
                pending = (code, handles, auths, salt)
            } else if let command = pending {
                pending = nil
                guard Self.handleCounts[command.code] != nil else { continue }
                if command.code == CommandCode.startAuthSession && code == 0 {
                    let handle = reader.u32()
                    sessions[handle] = Session(handle: handle, saltedWith: command.salt)
                }
                commands.append(Command(code: command.code, handles: command.handles, authorizations: command.auths,
                                        sessions: command.auths.map { sessions[$0.handle] }, response: code))
            }
        }
    }

    /// Each TCP frame's payload, and whether it went to the TPM (destination port 2321).
    private static func tcpPayloads(_ bytes: [UInt8]) -> [(Bool, [UInt8])] {
        var frames: [(Bool, [UInt8])] = []
        var offset = 0
        func le32(_ at: Int) -> Int { Int(bytes[at]) | Int(bytes[at + 1]) << 8 | Int(bytes[at + 2]) << 16 | Int(bytes[at + 3]) << 24 }
        while offset + 12 <= bytes.count {
            let type = le32(offset), length = le32(offset + 4)
            guard length >= 12, offset + length <= bytes.count else { break }
            if type == 6 {  // Enhanced Packet Block: interface, timestamp (8), captured and original length
                let captured = le32(offset + 20)
                let frame = Array(bytes[(offset + 28)..<(offset + 28 + captured)])
                let ipHeader = Int(frame[0] & 0x0F) * 4
                let tcpHeader = Int(frame[ipHeader + 12] >> 4) * 4
                let destination = Int(frame[ipHeader + 2]) << 8 | Int(frame[ipHeader + 3])
                frames.append((destination == 2321, Array(frame[(ipHeader + tcpHeader)...])))
            }
            offset += length
        }
        return frames
    }

    private struct Reader {
        let bytes: [UInt8]
        var offset = 0
        init(_ bytes: [UInt8]) { self.bytes = bytes }
        mutating func u8() -> UInt8 { defer { offset += 1 }; return offset < bytes.count ? bytes[offset] : 0 }
        mutating func u16() -> UInt16 { UInt16(u8()) << 8 | UInt16(u8()) }
        mutating func u32() -> UInt32 { UInt32(u16()) << 16 | UInt32(u16()) }
        mutating func sized() -> [UInt8] {
            let count = Int(u16())
            defer { offset += count }
            return Array(bytes[min(offset, bytes.count)..<min(offset + count, bytes.count)])
        }
    }
}

struct CaptureError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
