import Glibc
import KeychainBasics
import Testing

@Suite struct ErrnoTests {
    @Test func aCallInterruptedBySignalsIsMadeAgain() {
        var calls = 0
        let result = valueOrErrno { () -> Int in
            calls += 1
            if calls < 3 { errno = EINTR; return -1 }
            return 7
        }
        #expect(result == .success(7))
        #expect(calls == 3)
    }

    @Test func anyOtherFailureIsItsTypedErrnoAtOnce() {
        var calls = 0
        let result = valueOrErrno { () -> Int32 in
            calls += 1
            return close(-1)
        }
        #expect(result == .failure(Errno(rawValue: EBADF)))
        #expect(calls == 1)
        #expect(Errno(rawValue: EBADF).description == String(cString: strerror(EBADF)))
    }

    @Test func sdBusNegatedErrnoIsTyped() {
        #expect(valueOrNegatedErrno(-ECONNRESET) == .failure(Errno(rawValue: ECONNRESET)))
        #expect(valueOrNegatedErrno(0) == .success(0))
        #expect(valueOrNegatedErrno(2) == .success(2))
    }
}
