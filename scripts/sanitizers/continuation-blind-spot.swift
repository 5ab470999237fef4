// scripts/sanitize.sh's witness for KeychainBasics' `handedOver` (built with -sanitize=thread): a thread
// writes a field, then resumes a continuation before its task suspended (the runtime's fast path); the
// task then reads the field. The resume orders the two, but ThreadSanitizer does not see it
// (swiftlang/swift#57803) and reports a race, as it did on a kept connection's reader in CI. Hence
// `handedOver` passes values through a lock; when this stops being reported, that lock can go.
import Dispatch
import Glibc

final class Shared: @unchecked Sendable { var field = 0 }

@main struct Witness {
    static func main() async {
        var wrong = 0
        for round in 1...200 {
            let shared = Shared()
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                DispatchQueue.global().async {
                    shared.field = round
                    continuation.resume()
                }
                usleep(2_000)  // resumed before the task suspends
            }
            if shared.field != round { wrong += 1 }
        }
        print(wrong)
    }
}
