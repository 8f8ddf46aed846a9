"""bootseer.config (with jobenv.py, the job-side half it ships into a job) is the only reader of
``BOOTSEER_*`` variables: a setting read anywhere else would escape ``config show``, the
config file and the flags. Writing them into a child's environment is fine everywhere."""

import ast
from pathlib import Path

import bootseer

SRC = Path(bootseer.__file__).parent
READERS = {"config/settings.py", "config/env.py", "jobenv.py"}
# The demo's job script runs inside the image without bootseer installed: the variables
# are its whole interface with the node, as RANK is torchrun's.
JOB_SCRIPTS = {"demo/train.py"}


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each ``BOOTSEER_*`` read: environ.get/[...]/getenv/pop with a literal."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in {"get", "getenv", "pop"} and node.args:
            key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str) \
                and key.value.startswith("BOOTSEER_"):
            target = node.func.value if isinstance(node, ast.Call) else node.value
            if "environ" in ast.unparse(target) or ast.unparse(target) == "os":
                found.append((node.lineno, key.value))
    return found


def test_only_config_reads_bootseer_variables():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in READERS or rel in JOB_SCRIPTS or "/proto/" in rel:
            continue
        for line, name in _reads(ast.parse(path.read_text(), str(path))):
            offenders.append(f"{rel}:{line} reads {name}")
    assert not offenders, "read it through bootseer.config instead:\n" + "\n".join(offenders)


def test_the_check_sees_each_form_of_read():
    code = ('import os\nos.environ.get("BOOTSEER_A")\nos.environ["BOOTSEER_B"]\n'
            'os.getenv("BOOTSEER_C")\nos.environ.pop("BOOTSEER_D", None)\n'
            'env = {}\nenv["BOOTSEER_E"] = "written, not read"\n')
    assert [n for _, n in _reads(ast.parse(code))] == \
        ["BOOTSEER_A", "BOOTSEER_B", "BOOTSEER_C", "BOOTSEER_D"]
