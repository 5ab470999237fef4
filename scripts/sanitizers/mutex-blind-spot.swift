// scripts/sanitize.sh's check of tsan.supp (built with -sanitize=thread): `mutex` uses a contended
// Synchronization.Mutex correctly, which ThreadSanitizer misreports as a race; `race` increments a counter
// from four threads with no lock at all, which it must still report with the suppressions.
import Glibc
import Synchronization

final class Shared: @unchecked Sendable {
    let guarded = Mutex<[Int]>([])
    var unguarded = 0
}

let shared = Shared()
let racy = CommandLine.arguments.dropFirst().first == "race"
var threads: [pthread_t] = []
for _ in 0..<4 {
    var thread = pthread_t()
    let made = pthread_create(&thread, nil, { context in
        let shared = Unmanaged<Shared>.fromOpaque(context!).takeRetainedValue()
        let racy = CommandLine.arguments.dropFirst().first == "race"
        for i in 0..<20_000 {
            if racy {
                shared.unguarded += 1
            } else {
                shared.guarded.withLock { values in
                    values.append(i)
                    if values.count > 100 { values.removeAll() }
                }
            }
        }
        return nil
    }, Unmanaged.passRetained(shared).toOpaque())
    precondition(made == 0)
    threads.append(thread)
}
for thread in threads { pthread_join(thread, nil) }
print(racy ? shared.unguarded : shared.guarded.withLock { $0.count })
