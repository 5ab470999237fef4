#!/usr/bin/env python3
"""The shape checks of issue 40's "Done when", read from the Swift sources as text (no build, no dependencies).

Finds, under Sources/:
- a source file over 600 lines;
- a function, initializer, deinit, subscript or closure assigned to a property over 80 lines
  (from its declaration's line to its closing brace's);
- a D-Bus argument forced open (`a[0].string!`, `arguments[1]!`) in Sources/SecretService: one is read through
  `Arguments`, which names the argument in an `InvalidArgs`, never with `!`;
- any `DaemonCaller` in code (the caller is the core's `Caller`);
- an `extension Engine` outside Sources/KeychainEngine (the engine is one target), and in the core or the engine
  (Sources/KeychainCore, Sources/KeychainEngine) an import of the facade, the daemon or D-Bus (`Keychain`,
  `KeychainDaemon`, `Keychaind`, `DBus`) or a name of the daemon's code or its client (`DaemonClient`,
  `DaemonServer`, `DaemonRequestHandler`);
- in the daemon (Sources/KeychainDaemon, Sources/keychaind) an import of the facade or what stands on it
  (`Keychain`, `SecretService`, `DBus`), and in Package.swift a `Keychain` among the KeychainDaemon or Keychaind
  target's dependencies: keychaind is the engine's service, not a client of the public API;
- in the core (Sources/KeychainCore) an import of the engine or of a TPM, SQLite, token or other C module
  (`KeychainEngine`, `TPM2`, `KeychainStore`, `PKCS11`, `CTSS2`, `CTSSCrypto`, `CSQLite`, `CP11Kit`, `COpenSSL`,
  `CSystemd`, `CSpawn`): the core is values and protocols.
Prints one line a finding (path:line: what) and exits 1 when there is any, 0 when there is none.
Braces, `!` and names inside string literals and comments do not count.

Usage: scripts/check-shape.py [ROOT]   (ROOT defaults to the checkout this script is in)
"""
import os
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


STRING_OPENING = re.compile(r'(#*)("""|")')


def blank(source):
    """`source` with every comment and string literal's content replaced by spaces, newlines kept, so that
    offsets and line numbers stay those of the source. Handles nested block comments, multi-line and raw
    strings (`#"…"#`) and interpolations (`\\(…)`, which are code and may hold strings of their own)."""
    out = list(source)
    n = len(source)
    i = 0
    # Each entry is an open string: (closing delimiter, raw hashes, paren depth of the interpolation we are
    # in when the string is inside one). The stack holds the strings we are inside of, innermost last.
    stack = []  # entries: [delimiter, hashes, interpolation_depth or None]

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        in_string = bool(stack) and stack[-1][2] is None
        if in_string:
            delimiter, hashes, _ = stack[-1]
            close = delimiter + "#" * hashes
            if source.startswith(close, i):
                stack.pop()
                i += len(close)
                continue
            escape = "\\" + "#" * hashes
            if source.startswith(escape, i):
                after = i + len(escape)
                if after < n and source[after] == "(":
                    wipe(i, after)
                    stack[-1][2] = 0  # now inside an interpolation: code until its ")"
                    i = after + 1
                    continue
                wipe(i, min(after + 1, n))
                i = after + 1
                continue
            if source[i] != "\n":
                out[i] = " "
            i += 1
            continue
        c = source[i]
        if stack and stack[-1][2] is not None:  # inside an interpolation: track its parentheses
            if c == "(":
                stack[-1][2] += 1
            elif c == ")":
                if stack[-1][2] == 0:
                    stack[-1][2] = None  # back in the string
                    i += 1
                    continue
                stack[-1][2] -= 1
        if source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            wipe(i, end)
            i = end
            continue
        if source.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if source.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif source.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
            continue
        m = STRING_OPENING.match(source, i)
        if m and (m.group(1) == "" or c == "#"):
            hashes = len(m.group(1))
            stack.append([m.group(2), hashes, None])
            i = m.end()
            continue
        i += 1
    return "".join(out)


DECLARATION = re.compile(
    r"\bfunc\s+(?P<func>[^\s(<]+)"
    r"|(?<![.\w])(?P<init>init[?!]?)\s*(?=[(<])"
    r"|\b(?P<deinit>deinit)\s*\{"
    r"|\b(?P<subscript>subscript)\s*(?=[(<])"
    r"|\b(?:let|var)\s+(?P<closure>\w+)\s*(?::[^=\n{}]*)?=\s*\{"
)
# A line that starts another declaration: a function signature reaching it has no body (a protocol's).
NEXT_DECLARATION = re.compile(
    r"\s*(?:func|var|let|init|deinit|case|subscript|static|class|struct|enum|actor|extension|protocol|typealias"
    r"|associatedtype|private|fileprivate|internal|package|public|open|nonisolated|mutating|@|#|\})\b"
)


def find_body(code, index):
    """The offset of the `{` opening the body of the declaration that starts at `index`, or None when the
    declaration has none (a protocol requirement)."""
    depth = 0
    i = index
    n = len(code)
    while i < n:
        c = code[i]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0:
            if c == "{":
                return i
            if c in "};":
                return None
            if c == "\n" and NEXT_DECLARATION.match(code, i + 1):
                return None
        i += 1
    return None


def matching_brace(code, opening):
    depth = 0
    for i in range(opening, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def long_functions(code, limit=MAX_FUNCTION_LINES):
    """(line, kind name, lines) of each function-like declaration in blanked `code` longer than `limit`."""
    found = []
    for m in DECLARATION.finditer(code):
        kind = next(k for k in ("func", "init", "deinit", "subscript", "closure") if m.group(k))
        name = m.group(kind)
        opening = m.end() - 1 if kind in ("deinit", "closure") else find_body(code, m.end())
        if opening is None:
            continue
        closing = matching_brace(code, opening)
        if closing is None:
            continue
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, closing) + 1
        lines = last - first + 1
        if lines > limit:
            label = {"func": "func " + name, "closure": "closure " + name}.get(kind, name)
            found.append((first, label, lines))
    return found


# A D-Bus argument forced open: a `DBusValue` accessor (`a[0].string!`), or an argument list's element
# (`arguments[1]!`, `a[0]!`) followed by `!` that is not `!=`.
DBUS_VALUE_ACCESSORS = "string|variantContent|entries|stringDictionary|pathList"
FORCE_UNWRAP = re.compile(
    r"(?:\.(?:" + DBUS_VALUE_ACCESSORS + r")|\barguments\s*\[[^\]\n]*\]|\b[a-z]\s*\[\s*\d+\s*\])\s*!(?!=)"
)


def force_unwraps(code):
    """Line numbers of the D-Bus arguments forced open in blanked `code`."""
    return [code.count("\n", 0, m.start()) + 1 for m in FORCE_UNWRAP.finditer(code)]


def daemon_callers(code):
    return [code.count("\n", 0, m.start()) + 1 for m in re.finditer(r"\bDaemonCaller\b", code)]


ENGINE_EXTENSION = re.compile(r"\bextension\s+Engine\b")
UPWARD_IMPORT = re.compile(r"^[ \t]*(?:@\w+[ \t]+)*(?:(?:internal|package|public|private|fileprivate)[ \t]+)?import[ \t]+"
                           r"(Keychain|KeychainDaemon|Keychaind|DBus)\b", re.MULTILINE)
DAEMON_FACADE_IMPORT = re.compile(r"^[ \t]*(?:@\w+[ \t]+)*(?:(?:internal|package|public|private|fileprivate)[ \t]+)?import[ \t]+"
                                  r"(Keychain|SecretService|DBus)\b", re.MULTILINE)
CORE_DOWNWARD_IMPORT = re.compile(r"^[ \t]*(?:@\w+[ \t]+)*(?:(?:internal|package|public|private|fileprivate)[ \t]+)?import[ \t]+"
                                  r"(KeychainEngine|TPM2|KeychainStore|PKCS11|CTSS2|CTSSCrypto|CSQLite|CP11Kit|COpenSSL|CSystemd|CSpawn)\b",
                                  re.MULTILINE)
DAEMON_TARGETS = ("KeychainDaemon", "Keychaind")
DAEMON_FOLDERS = ("Sources/KeychainDaemon/", "Sources/keychaind/")
DAEMON_NAME = re.compile(r"\b(DaemonClient|DaemonServer|DaemonRequestHandler)\b")


def engine_extensions(code):
    return [code.count("\n", 0, m.start()) + 1 for m in ENGINE_EXTENSION.finditer(code)]


def upward_references(code):
    """(line, name) of each import of a module above the engine, and each name of the daemon's code, in blanked `code`."""
    found = [(code.count("\n", 0, m.start()) + 1, "import " + m.group(1)) for m in UPWARD_IMPORT.finditer(code)]
    found += [(code.count("\n", 0, m.start()) + 1, m.group(1)) for m in DAEMON_NAME.finditer(code)]
    return sorted(found)


def daemon_facade_imports(code):
    """(line, module) of each import of the facade, or of a module on it, in blanked `code`."""
    return [(code.count("\n", 0, m.start()) + 1, m.group(1)) for m in DAEMON_FACADE_IMPORT.finditer(code)]


def core_downward_imports(code):
    """(line, module) of each import of the engine, or of a TPM, SQLite, token or other C module, in blanked `code`."""
    return [(code.count("\n", 0, m.start()) + 1, m.group(1)) for m in CORE_DOWNWARD_IMPORT.finditer(code)]


def daemon_target_facade_dependencies(manifest):
    """(line, target) of each daemon target in Package.swift's text whose dependencies name `Keychain`."""
    code = blank_strings_kept(manifest)
    found = []
    for m in re.finditer(r'\.target\(\s*name:\s*"(\w+)"\s*,\s*dependencies:\s*\[([^\]]*)\]', code):
        if m.group(1) in DAEMON_TARGETS and re.search(r'"Keychain"', m.group(2)):
            found.append((code.count("\n", 0, m.start()) + 1, m.group(1)))
    return found


def blank_strings_kept(source):
    """`source` with its comments blanked and its strings kept (the manifest names targets in strings)."""
    return re.sub(r"//[^\n]*", lambda m: " " * len(m.group(0)), source)


def check_file(path, relative, source):
    """The findings in one Swift file, as (path:line, what) lines."""
    findings = []
    line_count = source.count("\n") + (0 if source.endswith("\n") or not source else 1)
    if line_count > MAX_FILE_LINES:
        findings.append(f"{relative}:1: file of {line_count} lines (over {MAX_FILE_LINES})")
    code = blank(source)
    for line, label, lines in long_functions(code):
        findings.append(f"{relative}:{line}: {label} of {lines} lines (over {MAX_FUNCTION_LINES})")
    if relative.replace(os.sep, "/").startswith("Sources/SecretService/"):
        for line in force_unwraps(code):
            findings.append(f"{relative}:{line}: D-Bus argument forced open with ! (read it with Arguments, which names it in InvalidArgs)")
    for line in daemon_callers(code):
        findings.append(f"{relative}:{line}: DaemonCaller (the core's Caller is passed per call)")
    slashed = relative.replace(os.sep, "/")
    if slashed.startswith("Sources/") and not slashed.startswith("Sources/KeychainEngine/"):
        for line in engine_extensions(code):
            findings.append(f"{relative}:{line}: extension Engine outside Sources/KeychainEngine (the engine is one target)")
    if slashed.startswith(("Sources/KeychainCore/", "Sources/KeychainEngine/")):
        for line, name in upward_references(code):
            findings.append(f"{relative}:{line}: {name} in the core or the engine (they name no facade, daemon or D-Bus)")
    if slashed.startswith("Sources/KeychainCore/"):
        for line, module in core_downward_imports(code):
            findings.append(f"{relative}:{line}: import {module} in the core (values and protocols: no engine, TPM, SQLite or token)")
    if slashed.startswith(DAEMON_FOLDERS):
        for line, module in daemon_facade_imports(code):
            findings.append(f"{relative}:{line}: import {module} in the daemon (keychaind serves the engine: import KeychainEngine)")
    return findings


def check_tree(root):
    findings = []
    sources = os.path.join(root, "Sources")
    for directory, subdirectories, files in os.walk(sources):
        subdirectories.sort()
        for name in sorted(files):
            if not name.endswith(".swift"):
                continue
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as handle:
                source = handle.read()
            findings += check_file(path, os.path.relpath(path, root), source)
    manifest = os.path.join(root, "Package.swift")
    if os.path.exists(manifest):
        with open(manifest, encoding="utf-8") as handle:
            for line, target in daemon_target_facade_dependencies(handle.read()):
                findings.append(f"Package.swift:{line}: target {target} depends on Keychain (the daemon depends on KeychainEngine, not the facade)")
    return findings


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.isdir(os.path.join(root, "Sources")):
        print(f"check-shape: {root} has no Sources folder; give the checkout's root", file=sys.stderr)
        return 2
    findings = check_tree(root)
    for finding in findings:
        print(finding)
    if findings:
        print(f"check-shape: {len(findings)} finding(s)", file=sys.stderr)
        return 1
    print("check-shape: no file over 600 lines, no function over 80, no D-Bus argument forced open, no DaemonCaller, "
          "no extension Engine outside the engine, nothing above the engine named in it or the core, no facade in the daemon, "
          "no engine, TPM, SQLite or token module in the core")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
