"""The task every agent gets: a scratch git repository holding ``calc.py``, whose ``add``
subtracts, and a unittest that catches it; after the agent, whether the tests pass."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROMPT = (
    "Fix the bug in calc.py so that the tests in test_calc.py pass "
    "(run them with: python3 -m unittest test_calc)."
)
FILES = {
    ".gitignore": "__pycache__/\n",
    "calc.py": (
        '"""Small arithmetic helpers."""\n\n\n'
        "def add(a, b):\n    return a - b\n\n\n"
        "def multiply(a, b):\n    return a * b\n"
    ),
    "test_calc.py": (
        "import unittest\n\nfrom calc import add, multiply\n\n\n"
        "class CalcTest(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n"
        "    def test_multiply(self):\n        self.assertEqual(multiply(2, 3), 6)\n\n\n"
        'if __name__ == "__main__":\n    unittest.main()\n'
    ),
}


def _git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=agents check", "-c", "user.email=agents@localhost"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=repo, check=True, capture_output=True, text=True
    )
    return done.stdout


def make_repo(repo: Path) -> Path:
    """A fresh git repository at ``repo`` with the task's files committed."""
    repo.mkdir(parents=True)
    for name, text in FILES.items():
        (repo / name).write_text(text)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "calc with a bug")
    return repo


def outcome(repo: Path) -> dict:
    """After the agent: whether the tests pass, and which files it changed (names only)."""
    tests = subprocess.run(
        [sys.executable, "-m", "unittest", "-q", "test_calc"],
        cwd=repo,
        capture_output=True,
        timeout=60,
    )
    changed = _git(repo, "status", "--porcelain").split("\n")
    return {
        "tests_pass": tests.returncode == 0,
        "changed": sorted(line[3:] for line in changed if line.strip()),
    }
