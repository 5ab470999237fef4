"""The Python blocks of docs/python.md and the README compile, and name only what the package exports."""
import ast
import os
import re

import keychain

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_the_docs_python_blocks_compile_and_import_what_exists():
    blocks = []
    for doc in ("docs/python.md", "README.md"):
        blocks += re.findall(r"```python\n(.*?)```", open(os.path.join(ROOT, doc), encoding="utf-8").read(), re.S)
    assert len(blocks) >= 3
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "keychain":
                assert all(hasattr(keychain, alias.name) for alias in node.names), ast.dump(node)
