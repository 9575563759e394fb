"""Property-based recipes (#46, item 6): whatever a recipe holds, ``preflight`` ends bounded, in 0, 1 or 2, one line.

Each example writes one to four YAML files and runs the command on the first, in this process, as ``nemo-rl-shim
preflight --config f0.yaml --dry-run --world 2 --json`` runs it (the recipe read in its bounded child, then the
options, then a dry run on torch's fake backend). Hypothesis draws what the files hold:

* ``defaults:`` naming the other files (chains, diamonds, cycles, the file itself), a missing file, a bad type;
* keys whose values are scalars, lists, mappings (``_override_`` markers, ``???``), anchors and aliases (undefined
  ones too), and interpolations: of a key (relative ones too), NeMo RL's resolvers (``add``, ``mul``, ``div``,
  ``max``), OmegaConf's (``oc.env``, ``oc.select``), an unknown resolver, a string doubling, a malformed ``${``;
* a ``policy`` section whose ``distributed_timeout_minutes`` is a number, null, mandatory, a string or an
  interpolation, so that some examples reach the dry run and end 0 or 1; beside it, sometimes one of the shim's own
  keys (``patch_automodel``, ``distributed_timeout_minutes_after_init``) in ``nemo_rl_shim``, or in its old place
  inside ``automodel_cfg``, which is refused naming the old and the new key;
* sometimes an interpolation bomb (8 to 22 levels) or an alias bomb.

Every example must end with exit 0, 1 or 2 within :data:`EXAMPLE_S`, never a traceback; standard output is one JSON
object that agrees with the exit; exit 2 is one line on stderr that names a file of the recipe (or, for a value the
checks refuse, the key). CI runs :data:`CI_EXAMPLES` derandomized examples; ``NEMO_RL_SHIM_RECIPE_EXAMPLES=N`` runs N
(docs/testing.md records a longer run).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from nemo_rl_shim.cli import main
from tests.harness.hostile_inputs import alias_bomb, interpolation_bomb

pytestmark = [pytest.mark.multiprocess]

#: Examples per CI run (about 1 s each here: the child's interpreter, the options, a 2-rank dry run).
CI_EXAMPLES = int(os.environ.get("NEMO_RL_SHIM_RECIPE_EXAMPLES", "30"))
#: Each example's --timeout-s, and the wall time it must end within (generous: the machine is shared).
TIMEOUT_S = 60
EXAMPLE_S = TIMEOUT_S + 30.0
KEYS = [f"k{i}" for i in range(6)]

key = st.sampled_from(KEYS)
scalar = st.sampled_from(["1", "-3", "2.5", "0", "null", "true", '"text"', "'???'", ".inf", "1e400", "'٤٥'"])
interpolation = st.one_of(
    key.map(lambda k: f'"${{{k}}}"'),
    key.map(lambda k: f'"${{..{k}}}"'),
    st.tuples(
        st.sampled_from(["add", "mul", "max", "div"]), key, st.one_of(key.map(lambda k: f"${{{k}}}"), scalar)
    ).map(lambda t: f'"${{{t[0]}:${{{t[1]}}},{t[2]}}}"'),
    key.map(lambda k: f'"${{oc.select:{k},1}}"'),
    st.just('"${oc.env:NEMO_RL_SHIM_UNSET_FOR_FUZZ,3}"'),
    st.just('"${oc.env:NEMO_RL_SHIM_UNSET_FOR_FUZZ}"'),
    st.just('"${no_such_resolver:1}"'),
    key.map(lambda k: f'"${{{k}}}${{{k}}}"'),
    st.just('"${"'),
    st.just('"${policy.automodel_cfg.distributed_timeout_minutes}"'),
)
leaf = st.one_of(scalar, interpolation)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        st.lists(
            st.tuples(st.sampled_from(["a", "b", "_override_", "c"]), inner), max_size=3, unique_by=lambda t: t[0]
        ).map(lambda pairs: "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"),
    ),
    max_leaves=6,
)
timeout = st.sampled_from(["45", "null", "'???'", '"45"', "-1", '"${k0}"', '"${add:${k0},1}"', "0.00000001"])


@st.composite
def recipe_file(draw: st.DrawFn, index: int, files: int) -> str:
    lines = []
    later = [f"f{i}.yaml" for i in range(index + 1, files)]  # chains and diamonds
    defaults = draw(st.lists(st.sampled_from(later), max_size=3)) if later else []
    rare = draw(st.integers(0, 9))  # Hypothesis starts from the simplest value, 0: 9 is the rare one
    if rare == 9:
        defaults.append(draw(st.sampled_from([f"f{i}.yaml" for i in range(index + 1)] + ["missing.yaml"])))
    if defaults:
        lines.append("defaults: " + (defaults[0] if len(defaults) == 1 else "[" + ", ".join(defaults) + "]"))
    elif draw(st.booleans()) and index > 0:
        lines.append(draw(st.sampled_from(["defaults: 5", "defaults: {a: 1}"])))
    anchors: list[str] = []
    for name in draw(st.lists(key, max_size=5, unique=True)):
        if anchors and draw(st.booleans()):
            lines.append(f"{name}: *{draw(st.sampled_from(anchors))}")
            continue
        anchor = f"&x{len(anchors)} " if draw(st.booleans()) else ""  # not alias_bomb's a0, a1, ...
        if anchor:
            anchors.append(f"x{len(anchors)}")
        lines.append(f"{name}: {anchor}{draw(value)}")
    if draw(st.integers(0, 9)) == 9:
        lines.append(f"{draw(key)}: *undefined")
    if index == 0 or draw(st.booleans()):
        v2 = draw(st.sampled_from(["true", "false", "null"]))  # false or null: a job off the checked path, exit 1
        # The shim's own keys: in their block, in their old place inside automodel_cfg (refused), or absent.
        shim_key = draw(st.sampled_from(["", "patch_automodel", "distributed_timeout_minutes_after_init"]))
        shim_value = draw(scalar if shim_key == "patch_automodel" else timeout)
        old_place = bool(shim_key) and draw(st.integers(0, 3)) == 3
        moved = f", {shim_key}: {shim_value}" if old_place else ""
        shim = f", nemo_rl_shim: {{{shim_key}: {shim_value}}}" if shim_key and not old_place else ""
        lines.append(f"policy: {{dtensor_cfg: {{_v2: {v2}, cpu_offload: false}}, automodel_cfg: "
                     f"{{distributed_timeout_minutes: {draw(timeout)}{moved}}}{shim}}}")  # fmt: skip
    return "\n".join(line for line in lines if line) + "\n"


@st.composite
def recipe(draw: st.DrawFn) -> dict[str, str]:
    files = draw(st.integers(1, 4))
    texts = {f"f{i}.yaml": draw(recipe_file(i, files)) for i in range(files)}
    bomb = draw(st.sampled_from([None, None, None, "interpolation", "alias"]))
    if bomb == "interpolation":
        body = interpolation_bomb(draw(st.integers(8, 22))).split("\n", 2)[2]  # its keys, not its policy
        texts["f0.yaml"] += body
    elif bomb == "alias":
        texts["f0.yaml"] += alias_bomb(draw(st.integers(3, 9)))
    return texts


def _check(code: int, out: str, err: str, folder: Path, seconds: float, said: str) -> None:
    assert code in (0, 1, 2), said
    assert "Traceback" not in err and "itself failed" not in err, said
    report = json.loads(out)  # one JSON object on every path
    assert report["ok"] is (code == 0), said
    if code == 2:
        problem = report["problem"]
        assert err.strip().splitlines()[-1] == f"preflight: {problem}" and "\n" not in problem, said
        assert str(folder) in problem or problem.startswith("policy."), said
    assert seconds < EXAMPLE_S, said


@settings(
    max_examples=CI_EXAMPLES,
    deadline=None,
    database=None,  # nothing written beside the sources
    derandomize=True,  # the same examples every CI run; NEMO_RL_SHIM_RECIPE_EXAMPLES reaches further
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(texts=recipe())
def test_every_recipe_ends_in_a_defined_exit(texts: dict[str, str], capfd: pytest.CaptureFixture[str]) -> None:
    folder = Path(tempfile.mkdtemp(prefix="recipe-"))
    try:
        for name, text in texts.items():
            (folder / name).write_text(text)
        capfd.readouterr()
        start = time.monotonic()
        argv = ["preflight", "--config", str(folder / "f0.yaml"), "--dry-run", "--world", "2", "--json"]
        code = main([*argv, "--timeout-s", str(TIMEOUT_S)])
        seconds = time.monotonic() - start
        out, err = capfd.readouterr()
        said = f"exit {code} after {seconds:.1f} s\n{texts}\n--- stdout\n{out[-1500:]}\n--- stderr\n{err[-3000:]}"
        event(f"exit {code}")  # --hypothesis-show-statistics counts them
        if "l1: ${add:" in texts["f0.yaml"]:  # how an interpolation bomb ended
            event(f"interpolation bomb, exit {code}" + (", its CPU budget" if "s of CPU" in err else ""))
        if code == 2:
            event("refused: " + err.strip().splitlines()[-1].split("yaml: ")[-1][:70])
        if " has moved to policy.nemo_rl_shim." in err:
            event("a shim key in its old place, refused")
        _check(code, out, err, folder, seconds, said)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
