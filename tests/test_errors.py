"""The one error tree: every error class of evalsnap and storage derives from EvalsnapError
(or is listed as internal), pickles with its attributes, and is drawn, as it is, in the
docstring of :mod:`evalsnap.errors`.

Classes are found by importing every module of ``evalsnap`` and ``storage``, so a new error
class anywhere in them fails here until it joins the tree and the drawing.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pickle
import pkgutil
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

import evalsnap.errors as errors
from evalsnap.errors import EvalsnapError, UnsupportedSchemaVersion
from storage import CorruptObjectError, InvalidId, ObjectNotFound, StorageError, StoreUnavailable, TooLarge

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("evalsnap", "storage")

#: Instances of the classes whose constructor takes more than a message.
SAMPLES: dict[type[BaseException], BaseException] = {
    CorruptObjectError: CorruptObjectError("s3://b/v1/objects/unit/ab/cd", "sha256:" + "0" * 64,
                                           "sha256:" + "1" * 64),
    ObjectNotFound: ObjectNotFound("gs://b/v1/objects/record/ab/cd"),
    TooLarge: TooLarge("s3://b/v1/refs/runs/r1", 256 * 2**20),
    StoreUnavailable: StoreUnavailable("s3://b/p", "bucket 'b' does not exist"),
    InvalidId: InvalidId("../x", "ref name", "it contains '..'"),
    UnsupportedSchemaVersion: UnsupportedSchemaVersion("record sha256:ab", 9, 1),
}


def _modules() -> list[ModuleType]:
    """Every module of the product's packages; ``__main__`` modules would run the CLI."""
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if info.name.rsplit(".", 1)[-1] != "__main__":
                found.append(importlib.import_module(info.name))
    return found


@cache
def _exception_classes() -> dict[str, type[BaseException]]:
    """Simple name → every exception class defined at module level in the packages."""
    classes: dict[str, type[BaseException]] = {}
    for module in _modules():
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__):
                other = classes.setdefault(obj.__name__, obj)
                assert other is obj, f"two error classes named {obj.__name__}: {other}, {obj}"
    return classes


_TREE_LINE = re.compile(r"^    (?P<prefix>[│├└─ ]*)(?P<name>[A-Za-z_]\w*)\s+"
                        r"(?:(?P<module>[a-z_][\w.]*)\s+)?(?P<exit>\d)\s")
_INTERNAL_LINE = re.compile(r"^    (?P<name>_?[A-Z]\w*)\s+(?P<module>[a-z_][\w.]*)\s+\S")
_INTERNAL_MARK = "internal control flow"


@cache
def _drawing() -> tuple[list[tuple[int, str, str | None, int]], list[tuple[str, str]]]:
    """The docstring's tree as (depth, name, module, exit code) rows, and its internal
    classes as (name, module) rows."""
    doc = errors.__doc__ or ""
    assert "::\n" in doc and _INTERNAL_MARK in doc, "the tree drawing is missing"
    tree_text, internal_text = doc.split("::\n", 1)[1].split(_INTERNAL_MARK, 1)
    tree = []
    for line in tree_text.splitlines():
        match = _TREE_LINE.match(line)
        if match:
            depth = len(match["prefix"]) // 4
            tree.append((depth, match["name"], match["module"], int(match["exit"])))
    internal = []
    for line in internal_text.splitlines()[1:]:
        if not line.strip():
            break
        match = _INTERNAL_LINE.match(line)
        assert match, f"unreadable line in the internal list: {line!r}"
        internal.append((match["name"], match["module"]))
    return tree, internal


def test_every_error_class_is_in_the_tree_or_listed_as_internal() -> None:
    tree, internal = _drawing()
    drawn = {name for _, name, _, _ in tree}
    internal_names = {name for name, _ in internal}
    for name, cls in _exception_classes().items():
        if name in internal_names:
            assert not issubclass(cls, EvalsnapError), (
                f"{cls.__module__}.{name} derives from EvalsnapError: draw it in the tree of "
                "evalsnap/errors.py, not in its internal list")
            continue
        assert issubclass(cls, EvalsnapError), (
            f"{cls.__module__}.{name} is an error a user can meet but does not derive from "
            "evalsnap.errors.EvalsnapError; derive it (or list it as internal control flow "
            "in the docstring of evalsnap/errors.py if it never reaches a user)")
        assert name in drawn, f"{cls.__module__}.{name} is missing from the tree drawn in evalsnap/errors.py"


def test_the_drawing_is_the_tree() -> None:
    """Parents, modules and exit codes in the drawing are the classes' own."""
    tree, _ = _drawing()
    classes = _exception_classes()
    assert tree[0][:2] == (0, "EvalsnapError")
    parents: list[type[BaseException]] = []
    for depth, name, module, exit_code in tree:
        assert name in classes, f"the drawing names {name}, which no module of {PACKAGES} defines"
        cls = classes[name]
        del parents[depth:]
        if depth:
            assert len(parents) == depth, f"{name} is drawn without a parent"
            assert parents[-1] in cls.__bases__, f"{name} is drawn under {parents[-1].__name__}"
        parents.append(cls)
        expected_module = None if cls.__module__ == "evalsnap.errors" else cls.__module__
        assert module == expected_module, f"{name} lives in {cls.__module__}, drawn as {module}"
        assert exit_code == cls.exit_code, f"{name} exits {cls.exit_code}, drawn as {exit_code}"


def test_internal_classes_exist_where_the_drawing_says() -> None:
    _, internal = _drawing()
    assert internal
    for name, module_name in internal:
        cls = getattr(importlib.import_module(module_name), name, None)
        assert inspect.isclass(cls) and issubclass(cls, Exception), f"{module_name}.{name} is gone"
        assert not issubclass(cls, EvalsnapError), f"{name} is in the tree, not internal"


def test_storage_errors_are_a_subtree() -> None:
    assert issubclass(StorageError, EvalsnapError) and StorageError.exit_code == 2
    for cls in (CorruptObjectError, ObjectNotFound, StoreUnavailable, InvalidId):
        assert issubclass(cls, StorageError)


def _takes_a_message(cls: type[BaseException]) -> bool:
    return all("__init__" not in vars(k) for k in cls.__mro__ if k.__module__ != "builtins")


def test_every_error_pickles_with_its_attributes() -> None:
    for name, cls in sorted(_exception_classes().items()):
        if not issubclass(cls, EvalsnapError):
            continue
        if cls in SAMPLES:
            error = SAMPLES[cls]
        else:
            assert _takes_a_message(cls), (
                f"{name} has its own constructor: give it a __reduce__ and add a sample to "
                "SAMPLES in tests/test_errors.py")
            error = cls("what failed; what to do next")
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is cls and str(clone) == str(error), name
        assert vars(clone) == vars(error), name
        assert clone.exit_code == error.exit_code, name


def test_storage_error_attributes_survive_pickling() -> None:
    clone = pickle.loads(pickle.dumps(SAMPLES[CorruptObjectError]))
    assert isinstance(clone, CorruptObjectError)
    assert (clone.url, clone.expected, clone.actual) == (
        "s3://b/v1/objects/unit/ab/cd", "sha256:" + "0" * 64, "sha256:" + "1" * 64)
    unavailable = pickle.loads(pickle.dumps(SAMPLES[StoreUnavailable]))
    assert isinstance(unavailable, StoreUnavailable)
    assert (unavailable.url, unavailable.reason) == ("s3://b/p", "bucket 'b' does not exist")
    invalid = pickle.loads(pickle.dumps(SAMPLES[InvalidId]))
    assert isinstance(invalid, InvalidId)
    assert (invalid.value, invalid.what, invalid.reason) == ("../x", "ref name", "it contains '..'")


def test_errors_module_is_a_leaf() -> None:
    """storage imports evalsnap.errors; it must not pull anything in."""
    source = (ROOT / "evalsnap" / "errors.py").read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {"__future__", "typing"}, imported


@pytest.mark.parametrize("heavy", ["prefect", "google.adk", "typer"])
def test_importing_storage_stays_light(heavy: str) -> None:
    code = f"import sys, storage; print({heavy!r} in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False", f"`import storage` imports {heavy}"
