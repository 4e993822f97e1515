"""Runs the Python package's tests (python/tests, pytest) against the library
of this build, for ctest: exit 77 (ctest: skipped) where this python3 has no
pytest, torch or numpy.

    python3 tests/run_python_tests.py LIBGDN [pytest args...]
"""
import importlib.util
import os
import sys


def main():
    """A function under the __main__ guard: tests that start processes with the spawn
    method (test_cp.py) re-import this file in every child, which must not run pytest again."""
    missing = [m for m in ("pytest", "torch", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"skipped: {sys.executable} has no {', '.join(missing)} "
              "(pip install torch numpy pytest; .ci/run makes such an environment)")
        sys.exit(77)
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)
    os.environ["GDN_LIB"] = sys.argv[1]
    sys.path.insert(0, os.path.join(root, "python"))
    import pytest

    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", os.path.join(root, "python", "tests")] + sys.argv[2:]))


if __name__ == "__main__":
    main()
