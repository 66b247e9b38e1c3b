"""The docs stay true: the README's CLI reference is what `resaware --help` prints, every public function
and class has a docstring, and the exploration notebook runs top to bottom in its quick setting.

`python tests/test_docs.py` rewrites the README's CLI reference after a change to the CLI.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NOTEBOOK = ROOT / "notebooks" / "explore.ipynb"
START = "<!-- cli-reference: written by `python tests/test_docs.py`; a test keeps it equal to `resaware --help` -->"
END = "<!-- end of cli-reference -->"


def _commands(parser) -> dict:
    """A parser's subcommands, name -> parser (argparse keeps them on its subparsers action)."""
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(actions[0].choices) if actions else {}


def cli_reference() -> str:
    """`resaware --help`, then every command's --help folded, as the README shows them (100 columns)."""
    from resaware.cli import parser as cli

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal; the README is read at any width
    try:
        parser = cli.parser()
        parts = ["```", "$ resaware --help", parser.format_help().rstrip(), "```", ""]
        pending = [(f"resaware {name}", sub) for name, sub in _commands(parser).items()]
        while pending:
            prog, sub = pending.pop(0)
            parts += [f"<details><summary><code>{prog} --help</code></summary>", "", "```",
                      sub.format_help().rstrip(), "```", "</details>", ""]  # fmt: skip
            pending[0:0] = [(f"{prog} {name}", s) for name, s in _commands(sub).items()]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(parts).rstrip() + "\n"


def _readme_block() -> str:
    text = README.read_text()
    assert START in text and END in text, f"README.md lost its CLI reference markers ({START})"
    return text[text.index(START) + len(START) : text.index(END)].strip("\n") + "\n"


def test_readme_cli_reference_is_what_resaware_help_prints():
    assert _readme_block() == cli_reference(), "README's CLI reference is stale: run `python tests/test_docs.py`"


def _public(module):
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj.__doc__
        elif inspect.isclass(obj):
            own = obj.__doc__ or ""
            # A dataclass without a docstring gets its signature as one: that is not documentation.
            yield f"{module.__name__}.{name}", None if own.startswith(f"{name}(") else own
            for attr, member in vars(obj).items():
                member = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if not attr.startswith("_") and inspect.isfunction(member):
                    yield f"{module.__name__}.{name}.{attr}", member.__doc__


def test_every_public_function_and_class_has_a_docstring():
    import resaware

    missing = []
    for info in pkgutil.iter_modules(resaware.__path__):
        module = importlib.import_module(f"resaware.{info.name}")
        if not module.__doc__:
            missing.append(module.__name__)
        missing += [name for name, doc in _public(module) if not (doc or "").strip()]
    assert not missing, f"no docstring: {', '.join(missing)}"


def test_notebook_is_kept_without_outputs_and_quick_by_default():
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "clear the notebook's outputs"
    parameters = code[0]
    assert "parameters" in parameters.metadata.get("tags", []) and re.search(r"^QUICK = True$", parameters.source, re.M)


@pytest.mark.slow
def test_explore_notebook_runs_top_to_bottom(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    # Runs where a user would open it, beside its store and figures; any failing cell fails the test.
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    figures = tmp_path / "explore-figures"
    for png in ("tuning_curves.png", "cross_budget.png"):
        assert (figures / png).read_bytes()[:4] == b"\x89PNG", png
    assert "<svg" in (figures / "task_bars.svg").read_text()
    assert (figures / "model.so").stat().st_size > 0
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in shown)
    images = [o for o in shown if "image/png" in o.get("data", {})]
    assert len(images) == 3, "tuning curves, per-task bars and the heatmap are drawn inline"
    assert "robust budget: tune at" in text and "onnxruntime" in text
    assert "Traceback" not in text
    worst = float(re.search(r"worst output mismatch against ONNX Runtime: (\S+)", text).group(1))
    assert worst < 1e-4


if __name__ == "__main__":
    text = README.read_text()
    if START not in text or END not in text:
        sys.exit(f"README.md needs the markers {START} and {END}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{START}\n{cli_reference()}{END}{tail}")
    print("README.md: CLI reference rewritten")
