import Foundation
import Keychain

/// A desktop of a test's own for gcr's system prompter: `Xvfb` on a free display, and a person at its
/// keyboard (`xdotool`), typing into a dialog found by its title. `deinit` stops the X server.
///
/// Its calls block until the person is done (the dialog gone): call them from a thread that nothing
/// else waits on (a synchronous test), not from a task whose prompt needs Swift's shared pool to finish.
package final class TestDisplay: @unchecked Sendable {
    /// `:N`, for `DISPLAY`.
    package let display: String
    private let server: pid_t

    /// The programs a desktop prompt's test needs (scripts/setup-debian.sh installs them).
    package static let tools = ["/usr/bin/Xvfb", "/usr/bin/xdotool", "/usr/libexec/gcr-prompter", "/usr/bin/dbus-daemon"]

    /// The environment gcr-prompter needs beside `DISPLAY` (no accessibility bus, no dconf).
    package var prompterEnvironment: [String: String] {
        ["DISPLAY": display, "GDK_BACKEND": "x11", "NO_AT_BRIDGE": "1", "GSETTINGS_BACKEND": "memory"]
    }

    /// A bus's activation file for gcr's prompter (`org.gnome.keyring.SystemPrompter`), written into `directory`.
    package static func writePrompterService(into directory: String) throws {
        try "[D-BUS Service]\nName=\(SystemPrompterAuthenticator.busName)\nExec=/usr/libexec/gcr-prompter\n"
            .write(toFile: directory + "/\(SystemPrompterAuthenticator.busName).service", atomically: true, encoding: .utf8)
    }

    package init() throws {
        for tool in Self.tools where !FileManager.default.isExecutableFile(atPath: tool) {
            throw SoftwareTPMError("\(tool) is missing: scripts/setup-debian.sh installs it")
        }
        // Xvfb picks a free display and writes its number to fd 3 (-displayfd): tests starting displays
        // at the same time never race for one. (Processes.spawn closes every other descriptor in the child.)
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else {
            throw SoftwareTPMError("pipe: errno \(errno)")
        }
        defer { close(ends[0]) }
        let pid = Processes.spawn("/usr/bin/Xvfb", ["/usr/bin/Xvfb", "-displayfd", "3", "-screen", "0", "1024x768x24", "-nolisten", "tcp"],
                                  passing: ends[1])
        close(ends[1])
        guard let pid else {
            throw SoftwareTPMError("cannot start Xvfb: errno \(errno)")
        }
        server = pid
        var said: [UInt8] = []
        var byte: UInt8 = 0
        var ready = pollfd(fd: ends[0], events: Int16(POLLIN), revents: 0)
        while !said.contains(UInt8(ascii: "\n")), poll(&ready, 1, 60_000) > 0, read(ends[0], &byte, 1) == 1 { said.append(byte) }
        guard let number = Int(String(decoding: said, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)) else {
            kill(pid, SIGTERM)
            _ = Processes.wait(pid)
            throw SoftwareTPMError("Xvfb did not open a display within 60 s")
        }
        display = ":\(number)"
    }

    deinit {
        kill(server, SIGTERM)
        _ = Processes.wait(server)
    }

    /// Waits (up to five minutes: a loaded machine starts GTK slowly) for the window titled `title`, then types `text` and Return into it, as
    /// a person would, and waits (as long) until that window is gone: a next dialog of the same
    /// title is then another window. The text goes to xdotool on stdin (`type --file -`), never in its argv.
    package func type(_ text: String, into title: String) throws -> ChildResult {
        try act(on: title, "xdotool type --delay 40 --file - && xdotool key Return", input: Array(text.utf8))
    }

    /// Waits (up to five minutes) for the window titled `title`, presses `key` (an X keysym name: `Escape`)
    /// in it, and waits (as long) until that window is gone.
    package func press(_ key: String, into title: String) throws -> ChildResult {
        try act(on: title, "xdotool key \"$2\"", key)
    }

    /// Runs `action` (shell, the window's id in `$w`) on the first window titled `title` once it is
    /// shown and given the keyboard's focus, then waits for that window to be destroyed. Keys sent before
    /// GTK set up the dialog's entry are lost (a loaded machine showed an empty passcode, the dialog's
    /// cancel), hence the second's pause. Every wait is bounded, so a dialog that never comes fails the call.
    private func act(on title: String, _ action: String, _ argument: String = "", input: [UInt8] = []) throws -> ChildResult {
        try runChild("/bin/sh", ["-c", "w=$(timeout 300 xdotool search --sync --onlyvisible --name \"$1\" | head -n1) "
                                  + "&& [ -n \"$w\" ] || { echo \"no window titled '$1' was shown within 300 s\" >&2; exit 1; }; "
                                  + "{ xdotool windowactivate --sync \"$w\" 2>/dev/null; xdotool windowfocus --sync \"$w\"; } "
                                  + "&& sleep 1 && "
                                  + action + " && { timeout 300 sh -c 'while xdotool getwindowname \"$0\" >/dev/null 2>&1; do sleep 0.1; done' \"$w\" "
                                  + "|| { echo \"the window titled '$1' was still shown 300 s after the keys\" >&2; exit 1; }; }",
                                  "sh", title, argument], input: input, environment: ["DISPLAY": display])
    }
}
