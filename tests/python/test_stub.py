"""The package's type hints (optstate/_optstate.pyi, generated from the extension at build
time) name exactly what the extension defines with the C++ defaults, and every public call
has a docstring."""
import ast
import pathlib

import optstate
import optstate._optstate as ext
import optstate.torch as optstate_torch


def _stub():
    path = pathlib.Path(optstate.__file__).parent / "_optstate.pyi"
    assert path.exists(), "the stub is installed with the package"
    return ast.parse(path.read_text())


def _stub_classes():
    tree = _stub()
    return {node.name: {_member_name(f) for f in node.body} - {None}
            for node in tree.body if isinstance(node, ast.ClassDef)}


def _member_name(node):
    """A method's name, or an enum member's (`float32 = 0`); None for anything else."""
    if isinstance(node, ast.FunctionDef):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        return getattr(node.targets[0], "id", None)
    return None


def test_stub_matches_the_extension():
    stub = _stub_classes()
    assert set(stub) == {n for n in dir(ext) if not n.startswith("_")}
    for name, members in stub.items():
        defined = {m for m in dir(getattr(ext, name)) if not m.startswith("_")}
        assert members - {"__init__", "__repr__", "__enter__", "__exit__"} == defined, name


def test_stub_client_defaults_are_the_cpp_client_options_defaults():
    client = next(node for node in _stub().body
                  if isinstance(node, ast.ClassDef) and node.name == "Client")
    init = next(f for f in client.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    defaults = {a.arg: ast.literal_eval(d) for a, d in zip(init.args.kwonlyargs,
                                                           init.args.kw_defaults)}
    assert defaults == ext._default_client_options()


def test_public_calls_have_docstrings():
    for name in ("register", "step", "describe", "list_groups", "stats", "delete",
                 "export_state", "import_state", "allocate_shared_buffer"):
        doc = getattr(optstate.Client, name).__doc__
        assert doc and len(doc) > 40, name
    assert "Thread-safe" in optstate.Client.__doc__
    assert "shard" in optstate_torch.RemoteAdamW.__doc__
