"""tools/ncu_target.py's command line: --help explains the arguments, missing or bad ones are
refused with its usage and exit code 2 before torch touches a GPU."""
import importlib.util
import subprocess
import sys

import pytest

from samu import backends, paths

TOOL = paths.REPO_ROOT / "tools" / "ncu_target.py"


def _tool():
    spec = importlib.util.spec_from_file_location("ncu_target", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True,
                          cwd=paths.REPO_ROOT, timeout=300)


def test_help_explains_the_arguments():
    done = _run("--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python tools/ncu_target.py [-h] mixer shape backend")
    assert "BATCHxLENGTHxWIDTH" in done.stdout and "Nsight Compute" in done.stdout


def test_missing_arguments_give_the_usage_not_a_traceback():
    done = _run()
    assert done.returncode == 2
    assert "the following arguments are required: mixer, shape, backend" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args, words", [
    (["lstm", "1x16x16", "reference_chunked"], "unknown mixer 'lstm'"),
    (["samu", "1x16", "reference_chunked"], "bad shape '1x16'"),
    (["samu", "1x16x16", "fastest"], "unknown backend 'fastest' of samu; choose one of"),
])
def test_bad_arguments_are_refused(args, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        _tool().parse_args(args)
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


def test_good_arguments_are_parsed():
    backend = backends.available("samu")[0]
    args = _tool().parse_args(["samu", "1x32x16", backend])
    assert (args.mixer, args.shape, args.backend) == ("samu", (1, 32, 16), backend)
