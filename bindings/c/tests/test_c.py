"""libkeychain (bindings/c) against a real keychaind on a private swtpm: the C test programs, the golden bytes, the
exported symbols, and a program outside the checkout built with pkg-config after `make install`.

The library and the programs are built into a temporary folder (`make O=…`); keychaind and swtpm are started as
bindings/python's tests start them (binaries from KEYCHAIN_BIN, default .build/debug, which scripts/test.sh builds).
"""
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
# The Python binding's fixtures (its Recorder imports the package).
sys.path[:0] = [os.path.join(SOURCE, "..", "python", "tests"), os.path.join(SOURCE, "..", "python", "src")]

from keychaind import PASSCODE, Daemon  # noqa: E402
from terminal import on_terminal  # noqa: E402
from test_wire_golden import ASKED, GOLDEN, GOLDEN_ANSWERS, Recorder  # noqa: E402

TESTS = ["item_calls", "passcode_prompt", "wrong_passcode", "ended_prompts", "no_prompt", "no_terminal", "can_use",
         "bad_options", "bad_arguments", "application_identifier", "keychain_store", "threads", "untrusted_peer", "fork", "codes"]


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("c-build")
    done = subprocess.run(["make", "-s", "-C", SOURCE, f"O={out}", "all", "tests"], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return out


@pytest.fixture(scope="session")
def daemon():
    started = Daemon()
    yield started
    started.stop()


def run(argv, daemon=None, **kwargs):
    env = {"PATH": "/usr/bin:/bin"}
    if daemon is not None:
        env["KEYCHAIN_SOCKET"] = daemon.socket
    # A new session: no controlling terminal, so the terminal prompter has no one to ask.
    return subprocess.run(argv, env=env, capture_output=True, timeout=300, start_new_session=True,
                          stdin=subprocess.DEVNULL, **kwargs)


def test_the_c_test_program_passes_against_keychaind(build, daemon):
    done = run([str(build / "test_keychain")], daemon)
    lines = done.stdout.decode().splitlines()
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert [line.split(" ")[1] for line in lines if line.startswith("ok ")] == TESTS, lines


def test_no_memory_error_or_leak_under_valgrind(build, daemon):
    """The library's calls, prompts, errors and threads under memcheck: no invalid access, nothing lost (the kept
    connections stay reachable by design)."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (scripts/setup-debian.sh installs it)")
    done = run(["valgrind", "-q", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=9",
                str(build / "test_keychain"), "item_calls", "passcode_prompt", "wrong_passcode", "ended_prompts", "no_prompt",
                "can_use", "bad_options", "bad_arguments", "keychain_store", "threads"], daemon)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()[-4000:]


def test_a_kept_connection_keychaind_closed_while_idle_is_replaced_and_the_call_served(build):
    """keychaind ends idle connections after a second here: the next call is sent again on a new one, not on another
    kept one it closed too (seen failing with the resend removed, and with the resend on a kept connection)."""
    idle = Daemon(options=["--idle-timeout", "1"])
    try:
        done = run([str(build / "test_keychain"), "idle_closed"], idle)
    finally:
        idle.stop()
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert done.stdout.decode().startswith("ok idle_closed")


def test_no_freed_block_holds_a_value_or_a_passcode(build, daemon):
    done = run([str(build / "test_wipe")], daemon)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["ok check_sees_a_secret (1 checks)", "ok secrets_wiped (12 checks)"]


@pytest.fixture
def recorder():
    started = Recorder()
    yield started
    started.close()


def test_each_request_is_the_bytes_the_protocol_pinned(build, recorder):
    done = run([str(build / "golden"), recorder.socket, "requests"])
    assert done.returncode == 0, done.stderr.decode()
    outcomes = done.stdout.decode().splitlines()
    assert outcomes == [f"{name} INTERNAL recorded" for name in GOLDEN]
    frames = recorder.take()
    assert frames == list(GOLDEN.values())


def test_a_storage_naming_no_service_says_so_so_keychaind_gives_a_confined_caller_its_app_id(build, recorder):
    from keychain._wire import Message
    done = subprocess.run([str(build / "golden"), recorder.socket, "default"], env={"PATH": "/usr/bin:/bin", "KEYCHAIN_APP_ID": "org.example.App"},
                          capture_output=True, timeout=300, start_new_session=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().splitlines() == ["default INTERNAL recorded", "named INTERNAL recorded"]
    options = [Message.decode(Message.decode(bytes.fromhex(frame)).bytes(1)) for frame in recorder.take()]
    assert [o.string(1) for o in options] == ["org.example.App", "mail"]
    assert [o.bool(9) for o in options] == [True, None], "serviceIsDefault only where no service was named"


def test_each_prompt_answer_is_the_bytes_the_protocol_pinned(build, recorder):
    done = run([str(build / "golden"), recorder.socket, "answers"])
    assert done.returncode == 0, done.stderr.decode()
    names = ["cancel", "fallback", "finger", "interrupted", "passcode", "unavailable"]
    asked = "asked T|C|fingerprint,passcode|mail|token|2|no match"
    assert done.stdout.decode().splitlines() == [line for name in names for line in (asked, f"{name} INTERNAL recorded")]
    assert recorder.take() == [frame for name in names for frame in (ASKED, GOLDEN_ANSWERS[name])]


def test_the_exported_symbols_are_the_ones_listed_in_abi_txt(build):
    library = build / "libkeychain.so.1"
    exported = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    symbols = sorted(line.split()[-1] for line in exported.stdout.splitlines())
    with open(os.path.join(SOURCE, "abi.txt")) as listed:
        assert symbols == listed.read().split()
    dynamic = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    assert "Library soname: [libkeychain.so.1]" in dynamic


def test_a_program_outside_the_checkout_built_with_pkg_config_reads_its_secret_after_the_passcode(build, daemon, tmp_path):
    prefix = tmp_path / "prefix"
    done = subprocess.run(["make", "-s", "-C", SOURCE, f"O={build}", f"PREFIX={prefix}", "install"], capture_output=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if not p.is_dir()) == [
        "include/keychain.h", "lib/libkeychain.so", "lib/libkeychain.so.1", "lib/pkgconfig/keychain.pc"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "example.c").write_bytes(open(os.path.join(SOURCE, "example.c"), "rb").read())
    env = {"PATH": "/usr/bin:/bin", "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "keychain"], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert flags == [f"-I{prefix}/include", f"-L{prefix}/lib", "-lkeychain"]
    subprocess.run(["cc", "-Wall", "-Werror", "example.c", *flags, "-o", "example"], cwd=outside, env=env, check=True,
                   timeout=120)
    env = {"PATH": "/usr/bin:/bin", "KEYCHAIN_SOCKET": daemon.socket, "LD_LIBRARY_PATH": str(prefix / "lib")}
    done = on_terminal([str(outside / "example")], env, answer=(PASSCODE + "\n").encode(), stdin=b"r-123")
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode() == "r-123\nwhenUnlockedThisDeviceOnly passcode softwareTPM\n"
    terminal = done.stderr.decode().split("terminal: ", 1)[1]
    assert "Unlock the example's refresh token" in terminal and "Leave it locked" in terminal
    assert PASSCODE not in terminal  # read with echo off
    # Without a terminal the same read is INTERACTION_NOT_ALLOWED.
    done = subprocess.run([str(outside / "example")], env=env, capture_output=True, timeout=120, start_new_session=True,
                          input=b"r-123")
    assert done.returncode == 1
    assert done.stderr.decode().startswith("getItem: INTERACTION_NOT_ALLOWED: ")


# `systemd-tty-ask-password-agent --query` on a pty of its own (script), in a mount namespace where the agents'
# directory ($1) is /run/systemd/ask-password (the agent reads only that one), as Swift's AskPasswordPromptTests runs it.
AGENT = ["/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
         "mount --bind \"$1\" /run/systemd/ask-password && exec /usr/bin/script -qec "
         "'/usr/bin/systemd-tty-ask-password-agent --query' /dev/null", "sh"]


def asked(agents, seen, reader):
    """A question (an ask.* file) in `agents` not in `seen`, waited for as long as the machine's load needs."""
    for _ in range(1200):
        if reader.poll() is not None:
            raise AssertionError(f"the reader ended ({reader.returncode}) before asking: {reader.stderr.read().decode()}")
        for name in sorted(os.listdir(agents)):
            if name.startswith("ask.") and name not in seen:
                seen.add(name)
                return (agents / name).read_text()
        time.sleep(0.1)
    raise AssertionError(f"no question reached the agents' directory {agents} in two minutes")


def send_as(uid, path, datagram):
    """`datagram` to the socket at `path` from a child that has become `uid` (the kernel adds its credentials)."""
    pid = os.fork()
    if pid == 0:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
                sender.connect(path)
                os.setgid(uid)
                os.setuid(uid)
                sender.send(datagram)
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def test_without_a_terminal_the_default_prompter_asks_systemds_password_agents(build, daemon, tmp_path):
    """No terminal (a new session), XDG_RUNTIME_DIR/systemd/ask-password there: the read's question goes to the password
    agents, a real agent answers (another user's answer, sent first, is not taken). The passcode opens the item, an empty answer is USER_CANCELED (as in Swift), the
    passcode is never in the question's file, and the file and its socket are gone once the question ends."""
    for tool in ("/usr/bin/systemd-tty-ask-password-agent", "/usr/bin/script", "/usr/bin/unshare"):
        if not os.path.exists(tool):
            pytest.skip(f"{tool} is not installed")
    if os.geteuid() != 0 or not os.path.isdir("/run/systemd/ask-password"):
        pytest.skip("the agent's directory is bind-mounted over /run/systemd/ask-password: root and that folder needed")
    # A short folder of its own: the question's socket path must fit a sockaddr_un (108 bytes), which pytest's
    # tmp_path under CI's base folder does not leave room for (a CI run failed so: no question was ever written).
    runtime = pathlib.Path(tempfile.mkdtemp(prefix="kc-rt-", dir="/tmp"))
    agents = runtime / "systemd" / "ask-password"
    agents.mkdir(parents=True, mode=0o755)
    try:
        ask_the_agents(build, daemon, tmp_path, runtime, agents)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def ask_the_agents(build, daemon, tmp_path, runtime, agents):
    env = {"PATH": "/usr/bin:/bin", "KEYCHAIN_SOCKET": daemon.socket, "XDG_RUNTIME_DIR": str(runtime)}
    value = tmp_path / "value"
    value.write_bytes(b"r-123")
    seen = set()
    for typed, outcome in ((PASSCODE + "\n", 0), ("\n", 1)):
        with open(value, "rb") as stdin:
            reader = subprocess.Popen([str(build / "example")], env=env, stdin=stdin, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, start_new_session=True)
        try:
            question = asked(agents, seen, reader)
            assert f"PID={reader.pid}\n" in question and "Echo=0\n" in question, question
            assert re.search(rf"^Socket={re.escape(str(agents))}/sck\.[0-9a-f]{{16}}$", question, re.M), question
            assert re.search(r"^NotAfter=[0-9]+$", question, re.M), question
            assert "Id=keychain:org.example.vault/refreshToken\n" in question, question
            assert "Message=Unlock the example's refresh token — Passcode (empty: Leave it locked)\n" in question, question
            # Another user's cancel, sent first: not from root or this uid, so it is not the answer.
            socket_path = re.search(r"^Socket=(.*)$", question, re.M).group(1)
            assert send_as(65534, socket_path, b"-") == 0
            agent = subprocess.run(AGENT + [str(agents)], input=typed.encode(), capture_output=True, timeout=300)
            assert agent.returncode == 0, agent.stderr.decode()
            out, err = reader.communicate(timeout=300)
        finally:
            reader.kill()
            reader.wait()
        assert reader.returncode == outcome, err.decode()
        if outcome == 0:
            assert out.decode() == "r-123\nwhenUnlockedThisDeviceOnly passcode softwareTPM\n"
        else:
            assert err.decode().startswith("getItem: USER_CANCELED: "), err.decode()
        assert PASSCODE not in question
        assert os.listdir(agents) == [], "the question's file or socket stayed"


def test_the_debian_packages_hold_the_library_and_its_development_files(tmp_path):
    """libkeychain1 and libkeychain-dev, built as scripts/package-deb.sh builds them but with the build profile
    pkg.keychain-linux.clib (the C library alone, no Swift toolchain), in a copy: the checkout stays clean."""
    root = os.path.abspath(os.path.join(SOURCE, "..", ".."))
    source = tmp_path / "src"
    parts = ("debian", "dist", "bindings/c")
    # The files git tracks, so that what an earlier package build left in the checkout (debian/.debhelper, the
    # packages' trees) is not copied; every file of those folders where the source is not a git checkout.
    tracked = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", *parts], capture_output=True)
    if tracked.returncode == 0 and tracked.stdout:
        for name in tracked.stdout.decode().split("\0"):
            if name:
                os.makedirs((source / name).parent, exist_ok=True)
                shutil.copy2(os.path.join(root, name), source / name, follow_symlinks=False)
    else:
        for part in parts:
            shutil.copytree(os.path.join(root, part), source / part, ignore=shutil.ignore_patterns("build", "__pycache__"))
    done = subprocess.run(["dpkg-buildpackage", "-b", "-us", "-uc", "--build-profiles=pkg.keychain-linux.clib"], cwd=source,
                          capture_output=True, timeout=600)
    assert done.returncode == 0, done.stdout.decode()[-3000:] + done.stderr.decode()[-3000:]
    version = open(os.path.join(root, "dist", "VERSION")).read().strip()
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    multiarch = subprocess.run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True,
                               check=True).stdout.strip()

    def contents(package):
        listed = subprocess.run(["dpkg", "-c", str(tmp_path / f"{package}_{version}_{arch}.deb")], capture_output=True,
                                text=True, check=True).stdout
        return sorted(" ".join(line.split()[5:]).lstrip(".") for line in listed.splitlines() if not line.startswith("d"))
    lib = f"/usr/lib/{multiarch}"
    assert contents("libkeychain1") == [f"{lib}/libkeychain.so.1", "/usr/share/doc/libkeychain1/changelog.gz",
                                        "/usr/share/doc/libkeychain1/copyright"]
    assert contents("libkeychain-dev") == ["/usr/include/keychain.h", f"{lib}/libkeychain.so -> libkeychain.so.1",
                                           f"{lib}/pkgconfig/keychain.pc", "/usr/share/doc/libkeychain-dev/changelog.gz",
                                           "/usr/share/doc/libkeychain-dev/copyright"]
    control = tmp_path / "control"
    subprocess.run(["dpkg-deb", "-e", str(tmp_path / f"libkeychain1_{version}_{arch}.deb"), str(control)], check=True)
    assert (control / "shlibs").read_text() == f"libkeychain 1 libkeychain1 (>= {version})\n"
    symbols = (control / "symbols").read_text().split("\n", 2)[2].split()
    listed = open(os.path.join(SOURCE, "abi.txt")).read().split()
    assert sorted(symbols[0::2]) == sorted(s.replace("@@", "@") if "@@" in s else f"{s}@{s}" for s in listed)
    field = lambda package, name: subprocess.run(["dpkg-deb", "-f", str(tmp_path / f"{package}_{version}_{arch}.deb"), name],
                                                 capture_output=True, text=True, check=True).stdout.strip()
    assert field("libkeychain1", "Depends").startswith("libc6 (>= ")
    assert field("libkeychain-dev", "Depends") == f"libkeychain1 (= {version})"
    debs = [str(tmp_path / f"{package}_{version}_{arch}.deb") for package in ("libkeychain1", "libkeychain-dev")]
    linted = subprocess.run(["lintian", "--tag-display-limit", "0", *debs], capture_output=True, text=True, timeout=600)
    complaints = [line for line in (linted.stdout + linted.stderr).splitlines() if "running with root privileges" not in line]
    assert complaints == [], complaints


def test_the_c_blocks_of_docs_c_md_compile(tmp_path):
    """Each ```c block of docs/c.md, its #include lines hoisted and its statements the body of a function given what
    the prose leaves to the reader (token, token_length, use), compiles against keychain.h with warnings as errors."""
    text = open(os.path.join(SOURCE, "..", "..", "docs", "c.md")).read()
    blocks = re.findall(r"```c\n(.*?)```", text, re.S)
    assert blocks
    for n, block in enumerate(blocks):
        lines = block.splitlines()
        includes = [line for line in lines if line.startswith("#include")]
        body = "\n".join("    " + line for line in lines if not line.startswith("#include"))
        program = tmp_path / f"block{n}.c"
        program.write_text("\n".join(includes) + "\n#include <stdint.h>\n"
                           "static void use(const uint8_t *bytes, size_t length) { (void)bytes; (void)length; }\n"
                           f"void block(const char *token, size_t token_length) {{\n{body}\n}}\n")
        done = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-but-set-variable",
                               "-fsyntax-only", f"-I{SOURCE}", str(program)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"docs/c.md block {n + 1}:\n{done.stderr}"
