"""gptzoo's own suite passes whatever else is installed: a few tests that would notice a hard-coded list
of registered names, run in a subprocess with a distribution that adds a component of every kind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fakedist import FakeSite

import gptzoo
from gptzoo.hookspecs import KINDS

REPO = Path(__file__).resolve().parents[1]
EXTRA = "aextra"
"""Sorts before every built-in name: a test that assumes what comes first notices it too."""
EXTRAS = f"""
from gptzoo_plugins._activations import ReLU
from gptzoo_plugins._attentions import CausalSelfAttention
from gptzoo_plugins._mlps import DenseMLP
from gptzoo_plugins._norms import RMSNorm
from gptzoo_plugins._positions import NoPosition
from gptzoo_plugins._samplers import Temperature

COMPONENTS = {{
    "norm": RMSNorm,
    "activation": ReLU,
    "mlp": DenseMLP,
    "position": NoPosition,
    "attention": CausalSelfAttention,
    "sampler": Temperature,
}}


def hook(kind):
    def register_components(register):
        register({EXTRA!r}, COMPONENTS[kind], doc=f"an extra {{kind}}")

    register_components.__name__ = f"register_{{kind}}s"
    return gptzoo.hookimpl(register_components)


for kind in COMPONENTS:
    globals()[f"register_{{kind}}s"] = hook(kind)
"""
NAME_SENSITIVE = (
    "tests/test_plugins.py::test_unknown_component_suggests_the_closest_name",
    "tests/test_plugins.py::test_no_plugins_env_skips_third_party_plugins",
    "tests/test_plugins.py::test_plugin_failing_on_import_is_reported_and_others_keep_working",
    "tests/test_plugins_hostile.py::test_cli_keeps_going_after_a_plugin_interrupts_its_import",
    "tests/test_loader.py::test_checkpoint_overrides_are_validated",
    "tests/test_names.py::test_a_set_problem_names_the_override_not_the_recipe_file",
    "tests/test_contract_table.py::test_every_default_plugin_registers_documented_components",
    "tests/cli/test_cli_hostile.py::test_generate_checkpoint_applies_and_checks_overrides",
    "tests/cli/test_cli.py::test_list_and_recipes",
    "tests/inference/test_sampler_plugins.py::test_bad_sampler_flags_are_one_message_and_exit_2",
)


def test_name_sensitive_tests_pass_with_a_component_of_every_kind_installed(fake_site: FakeSite) -> None:
    fake_site.add("extras", "gptzoo_fake_extras", EXTRAS, dist="gptzoo-extras")
    registry = gptzoo.get_registry(strict=True)
    assert [registry.get(kind, EXTRA).qualified_name for kind in KINDS] == [f"gptzoo-extras:{EXTRA}"] * len(KINDS)
    assert EXTRA not in gptzoo.get_registry(third_party=False).names("norm")  # the built-ins hold no such name
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NAME_SENSITIVE],
        env=fake_site.env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ passed in [\d.]+s", summary), summary  # nothing failed, skipped or deselected
    assert int(summary.split()[0]) >= len(NAME_SENSITIVE)
