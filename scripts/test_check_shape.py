"""Unit tests of scripts/check-shape.py's scanner, on small samples: python3 -m unittest discover -s scripts -p 'test_check_shape.py'"""
import importlib.util
import os
import tempfile
import unittest

_spec = importlib.util.spec_from_file_location(
    "check_shape", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check-shape.py"))
shape = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(shape)


def function(name, body_lines, header="func {name}() {{"):
    return "\n".join([header.format(name=name)] + ["    x += 1"] * body_lines + ["}"]) + "\n"


def long_names(source, limit=shape.MAX_FUNCTION_LINES):
    return [(label, lines) for _, label, lines in shape.long_functions(shape.blank(source), limit)]


class BlankTests(unittest.TestCase):
    def test_strings_and_comments_become_spaces_and_keep_lines(self):
        source = 'let a = "{ // }" // { comment\n/* { /* nested } */ } */ let b = 1\n'
        code = shape.blank(source)
        self.assertEqual(len(code), len(source))
        self.assertEqual(code.count("\n"), 2)
        self.assertNotIn("{", code)
        self.assertNotIn("}", code)
        self.assertIn("let b = 1", code)

    def test_interpolation_is_code_and_its_strings_are_blanked(self):
        code = shape.blank('let s = "a \\(f("}")) b {"\nlet t = 2\n')
        self.assertIn("f(", code)
        self.assertNotIn("}", code)
        self.assertNotIn("{", code)
        self.assertIn("let t = 2", code)

    def test_multiline_and_raw_strings(self):
        code = shape.blank('let m = """\n  { " }\n  """\nlet r = #"a \\( { "# + "\\"{"\nlet z = 3\n')
        self.assertNotIn("{", code)
        self.assertIn("let z = 3", code)
        self.assertEqual(code.count("\n"), 5)

    def test_escaped_quote_does_not_close(self):
        code = shape.blank('let e = "\\" { "\nlet y = 4\n')
        self.assertNotIn("{", code)
        self.assertIn("let y = 4", code)


class LongFunctionTests(unittest.TestCase):
    def test_function_of_exactly_the_limit_passes(self):
        self.assertEqual(long_names(function("fits", shape.MAX_FUNCTION_LINES - 2)), [])

    def test_function_one_line_over_the_limit_is_found(self):
        self.assertEqual(long_names(function("tooLong", shape.MAX_FUNCTION_LINES - 1)), [("func tooLong", 81)])

    def test_initializer_and_closure_property_are_found(self):
        source = function("", 5, "init(a: Int = 0) {{") + function("", 5, "let handler: (Int) -> Void = {{ value in")
        self.assertEqual(long_names(source, limit=5), [("init", 7), ("closure handler", 7)])

    def test_braces_in_strings_do_not_end_a_function(self):
        source = 'func f() {\n    let s = "}}}"\n' + "    x += 1\n" * 10 + "}\n"
        self.assertEqual(long_names(source, limit=10), [("func f", 13)])

    def test_protocol_requirement_has_no_body(self):
        source = "protocol P {\n    func a() async throws(E) -> Int\n    func b()\n}\n" + function("c", 3)
        self.assertEqual(long_names(source, limit=3), [("func c", 5)])

    def test_multiline_signature_with_where_clause(self):
        source = "func g<T>(\n    a: T,\n    b: () -> Void = {}\n) -> Int\n    where T: Equatable {\n" + "    x += 1\n" * 4 + "}\n"
        self.assertEqual(long_names(source, limit=5), [("func g", 10)])

    def test_initializer_call_is_not_a_declaration(self):
        self.assertEqual(long_names("let v = Foo.init(a: 1)\nlet w = self.init(\n)\n", limit=0), [])


class OtherFindingTests(unittest.TestCase):
    def test_dbus_argument_forced_open_is_found(self):
        code = shape.blank('let n = a[0].string!\nlet m = call.arguments[1]!\nlet ok = a[0].string != nil\n')
        self.assertEqual(shape.force_unwraps(code), [1, 2])

    def test_other_unwraps_and_comments_are_not_dbus_arguments(self):
        code = shape.blank('let p = buffer.baseAddress!\n// a[0].string!\nlet q = "a[0].string!"\n')
        self.assertEqual(shape.force_unwraps(code), [])

    def test_daemon_caller_in_code_only(self):
        code = shape.blank("// DaemonCaller was here\nlet c: DaemonCaller\n")
        self.assertEqual(shape.daemon_callers(code), [2])

    def test_engine_extensions_and_upward_references_in_code_only(self):
        code = shape.blank('// extension Engine {}\nextension Engine {}\nlet s = "extension Engine"\n')
        self.assertEqual(shape.engine_extensions(code), [2])
        code = shape.blank("import KeychainCore\n@testable import Keychain\ninternal import DBus\n"
                           "import KeychainStore\n/// `DaemonClient` in a comment\nlet c: DaemonClient\n")
        self.assertEqual(shape.upward_references(code), [(2, "import Keychain"), (3, "import DBus"), (6, "DaemonClient")])


class TreeTests(unittest.TestCase):
    def write(self, root, relative, text):
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)

    def tree_findings(self, root, files):
        """The findings in `root` once each of `files` (relative path: text) is written there."""
        for relative, text in files.items():
            self.write(root, relative, text)
        return shape.check_tree(root)

    def test_a_clean_tree_passes(self):
        with tempfile.TemporaryDirectory() as root:
            self.write(root, "Sources/A/A.swift", function("small", 10))
            self.assertEqual(shape.main(["check-shape", root]), 0)

    def test_a_tree_with_a_long_file_a_long_function_and_a_forced_argument_fails(self):
        with tempfile.TemporaryDirectory() as root:
            self.write(root, "Sources/A/Big.swift", "let x = 1\n" * 601)
            self.write(root, "Sources/A/Long.swift", function("long", 90))
            self.write(root, "Sources/SecretService/P.swift", "let s = a[0].string!\n")
            findings = shape.check_tree(root)
            self.assertEqual(len(findings), 3, findings)
            self.assertTrue(findings[0].startswith(os.path.join("Sources", "A", "Big.swift") + ":1: file of 601 lines"))
            self.assertIn("func long of 92 lines", findings[1])
            self.assertIn("forced open", findings[2])
            self.assertEqual(shape.main(["check-shape", root]), 1)

    def test_an_engine_extension_outside_the_engine_and_a_facade_import_in_it_fail(self):
        with tempfile.TemporaryDirectory() as root:
            findings = self.tree_findings(root, {
                "Sources/KeychainEngine/E.swift": "extension Engine {}\n",
                "Sources/Keychain/F.swift": "import KeychainEngine\nextension Engine {}\n",
                "Sources/KeychainEngine/G.swift": "import Keychain\n",
                "Sources/KeychainDaemon/D.swift": "import KeychainEngine\nlet c: DaemonClient? = nil\n"})
            self.assertEqual(len(findings), 2, findings)
            self.assertIn(os.path.join("Sources", "Keychain", "F.swift") + ":2: extension Engine outside", findings[0])
            self.assertIn(os.path.join("Sources", "KeychainEngine", "G.swift") + ":1: import Keychain in the core", findings[1])

    def test_the_daemon_importing_the_facade_fails_and_importing_the_engine_passes(self):
        with tempfile.TemporaryDirectory() as root:
            self.assertEqual(self.tree_findings(root, {
                "Sources/KeychainDaemon/D.swift": "import KeychainEngine\nimport KeychainWire\n// import Keychain\n",
                "Sources/keychaind/K.swift": "import KeychainDaemon\nimport KeychainCLIText\n"}), [])
            findings = self.tree_findings(root, {
                "Sources/KeychainDaemon/E.swift": "import Glibc\n@preconcurrency import Keychain\n",
                "Sources/keychaind/L.swift": "internal import SecretService\n"})
            self.assertEqual(len(findings), 2, findings)
            self.assertIn(os.path.join("Sources", "KeychainDaemon", "E.swift") + ":2: import Keychain in the daemon", findings[0])
            self.assertIn(os.path.join("Sources", "keychaind", "L.swift") + ":1: import SecretService in the daemon", findings[1])
            self.assertEqual(shape.main(["check-shape", root]), 1)

    def test_the_core_importing_the_engine_or_a_tpm_sqlite_or_token_module_fails(self):
        with tempfile.TemporaryDirectory() as root:
            self.assertEqual(self.tree_findings(root, {
                "Sources/KeychainCore/C.swift": "import KeychainWire\nimport SecureMemory\n// import TPM2\nlet s = \"import KeychainStore\"\n",
                "Sources/KeychainEngine/E.swift": "import TPM2\nimport KeychainStore\n"}), [])
            findings = self.tree_findings(root, {
                "Sources/KeychainCore/D.swift": "import KeychainBasics\ninternal import TPM2\n@preconcurrency import KeychainEngine\n",
                "Sources/KeychainCore/Options/O.swift": "import CSQLite\n"})
            self.assertEqual(len(findings), 3, findings)
            self.assertIn(os.path.join("Sources", "KeychainCore", "D.swift") + ":2: import TPM2 in the core", findings[0])
            self.assertIn(os.path.join("Sources", "KeychainCore", "D.swift") + ":3: import KeychainEngine in the core", findings[1])
            self.assertIn(os.path.join("Sources", "KeychainCore", "Options", "O.swift") + ":1: import CSQLite in the core", findings[2])
            self.assertEqual(shape.main(["check-shape", root]), 1)

    def test_a_daemon_target_depending_on_the_facade_in_the_manifest_fails(self):
        manifest = ('.target(name: "Keychain", dependencies: ["KeychainEngine"]),\n'
                    '// .target(name: "KeychainDaemon", dependencies: ["Keychain"]),\n'
                    '.target(name: "KeychainDaemon", dependencies: ["KeychainEngine", "KeychainWire"]),\n'
                    '.target(name: "Keychaind", dependencies: ["KeychainDaemon", "Keychain", "KeychainCLIText"],\n    path: "x"),\n'
                    '.target(name: "SecretService", dependencies: ["Keychain"]),\n')
        self.assertEqual(shape.daemon_target_facade_dependencies(manifest), [(4, "Keychaind")])
        with tempfile.TemporaryDirectory() as root:
            findings = self.tree_findings(root, {"Package.swift": manifest, "Sources/A/A.swift": "let a = 1\n"})
            self.assertEqual(findings, ["Package.swift:4: target Keychaind depends on Keychain (the daemon depends on KeychainEngine, not the facade)"])


if __name__ == "__main__":
    unittest.main()
