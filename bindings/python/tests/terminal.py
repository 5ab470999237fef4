"""A program on a terminal of its own (a pty as its controlling terminal), answered at its passcode prompt."""
import fcntl
import os
import select
import subprocess
import termios
import time


def on_terminal(argv, env, answer=None, stdin=b""):
    """Runs `argv` in a new session whose controlling terminal is a pty; types `answer` once "Passcode" shows.
    Returns the completed process, the terminal's output appended to its stderr."""
    master, slave = os.openpty()
    name = os.ttyname(slave)
    os.close(slave)

    def controlling_terminal():
        fd = os.open(name, os.O_RDWR)
        fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
        os.close(fd)
    p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=controlling_terminal)
    p.stdin.write(stdin)
    p.stdin.close()
    p.stdin = None  # written and closed: communicate() must not flush it
    seen, end = b"", time.monotonic() + 60
    while p.poll() is None and time.monotonic() < end:
        if select.select([master], [], [], 0.2)[0]:
            try:
                seen += os.read(master, 4096)
            except OSError:  # EIO until the child opens the terminal
                time.sleep(0.05)
            if answer is not None and b"Passcode" in seen:
                os.write(master, answer)
                answer = None
    out, err = p.communicate(timeout=60)
    os.close(master)
    return subprocess.CompletedProcess(argv, p.returncode, out, err + b"\nterminal: " + seen)
