"""Hostile plugins: whatever a third-party plugin does at import or in its register hooks (Ctrl-C,
sys.exit, os._exit, malformed registrations, hanging, a broken entry_points.txt), it is reported as
failed with one line, the others keep working, and strict mode makes it a one-line error (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_run import run_error
from fakedist import SCALENORM, FakeSite
from test_plugins import report

import gptzoo
from gptzoo import plugin_manager
from gptzoo.cli import main
from gptzoo.plugin_manager import PluginExit
from gptzoo.registry import default_registry

REPO = Path(__file__).resolve().parents[1]
STRICT_TAIL = "; fix or uninstall it, or leave strict mode (strict=True or GPTZOO_STRICT_PLUGINS) to skip it"


@pytest.fixture(autouse=True)
def _plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("GPTZOO_NO_PLUGINS", "GPTZOO_STRICT_PLUGINS", "GPTZOO_PLUGIN_WARN_S"):
        monkeypatch.delenv(var, raising=False)


def strict_message(name: str, what: str) -> str:
    return f"plugin {name!r} (gptzoo-fake-{name} 1.0) {what}{STRICT_TAIL}"


def failed_error(site: FakeSite, name: str, source: str | None) -> str:
    """Install one hostile plugin (None: already there) beside a good one; the error it is reported
    with (the good one loads)."""
    if source is not None:
        site.add(name, f"gptzoo_fake_{name}", source)
    site.add("zgood", "gptzoo_fake_zgood", SCALENORM)  # sorts after every hostile one
    registry = gptzoo.get_registry()
    assert report(registry, "zgood").status == "ok" and "scalenorm" in registry.names("norm")
    info = report(registry, name)
    assert info.status == "failed"
    return info.error


# --- import ---------------------------------------------------------------------------------------

UNPRINTABLE = "class E(Exception):\n    def __str__(self):\n        raise RuntimeError\n\n\n"
"""An exception that cannot be printed: describing it falls back to its type name and repr."""
UNREPRESENTABLE = UNPRINTABLE.replace("\n\n\n", "\n\n    __repr__ = __str__\n\n\n")

IMPORT_CASES = {
    "ctrlc": ("raise KeyboardInterrupt\n", "KeyboardInterrupt"),
    "ctrlcmsg": ("raise KeyboardInterrupt('stop')\n", "KeyboardInterrupt: stop"),
    "sysexit": ("import sys\nsys.exit(4)\n", "called sys.exit(4) at import"),
    "osexit": ("import os\nos._exit(3)\n", "called os._exit(3) at import"),
    "multiline": ("raise ValueError('first line\\n\\n  second line')\n", "ValueError: first line second line"),
    "unprintable": (UNPRINTABLE + "raise E('boom')\n", "E (its __str__ raised RuntimeError): E('boom')"),
    "unrepresentable": (UNREPRESENTABLE + "raise E('boom')\n", "E (its __str__ raised RuntimeError)"),
    **{
        option: (
            f"@gptzoo.hookimpl({option}=True)\ndef register_norms(register):\n    register('fine', object)\n"
            "    yield\n",
            f"its register_norms is declared with {option}=True, which gptzoo never runs; declare it with a plain "
            "@gptzoo.hookimpl",
        )
        for option in ("wrapper", "hookwrapper")
    },
    "asynchook": (
        "@gptzoo.hookimpl\nasync def register_norms(register):\n    register('fine', object)\n",
        "its register_norms is a coroutine function (async def), which gptzoo never awaits; define it with a plain def",
    ),
    "generatorhook": (
        "@gptzoo.hookimpl\ndef register_activations(register):\n    yield\n    register('fine', object)\n",
        "its register_activations is a generator function (it yields), which gptzoo never iterates; define it "
        "without yield",
    ),
    "asyncgeneratorhook": (
        "@gptzoo.hookimpl\nasync def register_norms(register):\n    register('fine', object)\n    yield\n",
        "its register_norms is an async generator function (async def with yield), which gptzoo never iterates; "
        "define it with a plain def, without yield",
    ),
}


@pytest.mark.parametrize("name", IMPORT_CASES)
def test_plugin_import_raising_anything_is_reported_failed(
    fake_site: FakeSite, no_real_exit: object, name: str
) -> None:
    source, error = IMPORT_CASES[name]
    assert failed_error(fake_site, name, source) == error
    assert os._exit is no_real_exit  # put back
    with pytest.raises(gptzoo.PluginError) as excinfo:
        gptzoo.get_registry(strict=True)
    assert str(excinfo.value) == strict_message(name, f"failed to load: {error}")
    assert os._exit is no_real_exit


def test_cli_keeps_going_after_a_plugin_interrupts_its_import(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("ctrlc", "gptzoo_fake_ctrlc", "raise KeyboardInterrupt\n")
    fake_site.add("zgood", "gptzoo_fake_zgood", SCALENORM)
    assert main(["list", "norm", "--json"]) == 0
    captured = capsys.readouterr()
    names = [row["name"] for row in json.loads(captured.out)]
    assert "scalenorm" in names and names == [e.name for e in gptzoo.get_registry().all_entries("norm")]
    assert (
        captured.err
        == "warning: plugin 'ctrlc' (gptzoo-fake-ctrlc 1.0) failed: KeyboardInterrupt; see `gptzoo plugins`\n"
    )
    monkeypatch.setenv("GPTZOO_STRICT_PLUGINS", "1")
    assert run_error(capsys, "list", "norm") == f"error: {strict_message('ctrlc', 'failed to load: KeyboardInterrupt')}"


def test_cli_keeps_going_after_a_plugin_raises_an_unprintable_exception(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("unprintable", "gptzoo_fake_unprintable", UNPRINTABLE + "raise E('boom')\n")
    assert main(["list", "norm", "--json"]) == 0
    assert capsys.readouterr().err == (
        "warning: plugin 'unprintable' (gptzoo-fake-unprintable 1.0) failed: E (its __str__ raised RuntimeError): "
        "E('boom'); see `gptzoo plugins`\n"
    )
    monkeypatch.setenv("GPTZOO_STRICT_PLUGINS", "1")
    assert run_error(capsys, "list", "norm") == "error: " + strict_message(
        "unprintable", "failed to load: E (its __str__ raised RuntimeError): E('boom')"
    )


def test_os_exit_at_import_does_not_end_the_command(fake_site: FakeSite) -> None:
    """For real, in a subprocess: `gptzoo plugins` exits 0 and lists the plugin as failed; a reference
    to the stand-in a plugin kept exits for real once loading is over."""
    fake_site.add("osexit", "gptzoo_fake_osexit", "import os\nos._exit(3)\n")
    fake_site.add("keeper", "gptzoo_fake_keeper", "from os import _exit as EXIT\n")
    fake_site.add("zgood", "gptzoo_fake_zgood", SCALENORM)
    code = (
        "import json, sys, gptzoo.cli\n"
        "code = gptzoo.cli.main(['plugins', '--json'])\n"
        "sys.stdout.flush()\n"
        "sys.modules['gptzoo_fake_keeper'].EXIT(code + 5)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=fake_site.env(), capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 5, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert (rows["osexit"]["status"], rows["osexit"]["error"]) == ("failed", "called os._exit(3) at import")
    assert rows["keeper"]["status"] == rows["zgood"]["status"] == "ok"
    assert rows["zgood"]["registered"] == ["norm:scalenorm"]
    assert proc.stderr == ""  # `gptzoo plugins` reports failures in its table, not as warnings


def test_malformed_entry_point_value_is_reported(fake_site: FakeSite) -> None:
    fake_site.add("weird", "gptzoo_fake_weird", "")
    (fake_site.root / "gptzoo_fake_weird-1.0.dist-info" / "entry_points.txt").write_text("[gptzoo]\nweird = !!!\n")
    assert (
        failed_error(fake_site, "weird", None) == "its entry point weird = '!!!' is not 'module' or 'module:attribute'"
    )
    assert report(gptzoo.get_registry(), "weird").module == "!!!"


def test_unparsable_entry_points_txt_fails_that_distribution_only(fake_site: FakeSite) -> None:
    fake_site.add("unparsable", "gptzoo_fake_unparsable", "")
    info_dir = fake_site.root / "gptzoo_fake_unparsable-1.0.dist-info"
    (info_dir / "entry_points.txt").write_text("[gptzoo]\nno equals sign here\n")
    fake_site.add("zgood", "gptzoo_fake_zgood", SCALENORM)
    registry = gptzoo.get_registry()
    assert report(registry, "zgood").status == "ok"
    info = report(registry, "gptzoo-fake-unparsable")
    assert (info.status, info.module, info.distribution) == ("failed", "unknown", "gptzoo-fake-unparsable")
    assert info.error == (
        "its entry_points.txt cannot be parsed (TypeError: Pair.__new__() missing 1 required positional argument: "
        "'value')"
    )
    # a distribution that does not declare the group is none of gptzoo's business
    (info_dir / "entry_points.txt").write_text("[console_scripts]\nno equals sign here\n")
    assert [p.name for p in gptzoo.get_registry().failed] == []


# --- register hooks -------------------------------------------------------------------------------


def hook(body: str, kind: str = "norm") -> str:
    return f"@gptzoo.hookimpl\ndef register_{kind}s(register):\n    {body}\n"


PROV = "gptzoo_fake_{name} (gptzoo-fake-{name} 1.0)"
NAME_RULE = "; a name is 1 to 64 letters, digits, '_', '-' or '.', starting with a letter, digit or '_'"
FACTORY_RULE = "; pass the class or function that builds it"
REGISTER_CASES = {
    "ctrlcreg": (hook("raise KeyboardInterrupt"), "KeyboardInterrupt"),
    "osexitreg": (hook("import os; os._exit(7)"), "called os._exit(7) while registering"),
    "sysexitreg": (hook("import sys; sys.exit('bye')"), "called sys.exit('bye') while registering"),
    "sysexitobj": (
        hook("import sys; sys.exit(type('R', (), {'__repr__': lambda self: 1 / 0})())"),
        "called sys.exit(<R object>) while registering",
    ),
    "late": (
        "kept = []\n\n" + hook("kept.append(register)") + hook("kept[0]('fine', object)", "activation"),
        PROV + ": register() was called after register_norms returned; call it inside the hook",
    ),
    "unprintablereg": (UNPRINTABLE + hook("raise E('boom')"), "E (its __str__ raised RuntimeError): E('boom')"),
    "spacename": (
        hook("register('my norm', object)"),
        PROV + " registered an invalid norm name: 'my norm'" + NAME_RULE,
    ),
    "emptyname": (
        hook("register('', object)"),
        PROV + " registered an invalid norm name: ''" + NAME_RULE,
    ),
    "listname": (
        hook("register(['x'], object)", "activation"),
        PROV + " registered an invalid activation name: an object of type list" + NAME_RULE,
    ),
    "longname": (
        hook("register('n' * 65, object)"),
        PROV + f" registered an invalid norm name: '{'n' * 56}..." + NAME_RULE,
    ),
    "notcallable": (
        hook("register('fine', 42)"),
        PROV + " registered norm 'fine' with a factory that is not callable: 42" + FACTORY_RULE,
    ),
    "objfactory": (
        hook("register('fine', object())"),
        PROV + " registered norm 'fine' with a factory that is not callable: an object of type object" + FACTORY_RULE,
    ),
    "baddoc": (
        hook("register('fine', object, doc=['one line'])"),
        PROV + " registered norm 'fine' with a doc that is not a str: an object of type list; doc is one line of "
        "text, or None for the factory's docstring",
    ),
    "ansidoc": (
        hook("register('fine', object, doc='\\x1b[31mred\\x1b[0m')"),
        PROV + " registered norm 'fine' with a doc holding a control character: '\\x1b[31mred\\x1b[0m'; doc is one "
        "line of plain text",
    ),
    "ansidocstring": (
        'class Fine:\n    """\\x1b[2Jcleared the screen."""\n\n\n' + hook("register('fine', Fine)"),
        PROV + " registered norm 'fine' with a factory whose docstring holds a control character in its first "
        "line: '\\x1b[2Jcleared the screen.'; write that line as plain text, or pass doc",
    ),
    "surrogatedoc": (
        hook("register('fine', object, doc='caf\\udce9')"),
        PROV + " registered norm 'fine' with a doc holding a lone surrogate: 'caf\\udce9'; doc is one line of "
        "plain text",
    ),
    "badoverride": (
        hook("register('fine', object, override='yes')"),
        PROV + " registered norm 'fine' with an override that is not a bool: 'yes'; use True or False",
    ),
    "badcall": (
        hook("register('fine')"),
        "TypeError: register() missing 1 required positional argument: 'factory'",
    ),
}


@pytest.mark.parametrize("name", REGISTER_CASES)
def test_bad_registration_fails_the_plugin_naming_it(fake_site: FakeSite, no_real_exit: object, name: str) -> None:
    source, error = REGISTER_CASES[name]
    error = error.format(name=name)
    assert failed_error(fake_site, name, source) == error
    assert os._exit is no_real_exit
    assert "fine" not in gptzoo.get_registry().names("norm")
    with pytest.raises(gptzoo.PluginError) as excinfo:
        gptzoo.get_registry(strict=True)
    assert str(excinfo.value) == strict_message(name, f"failed while registering: {error}")


def test_register_kept_past_its_hook_refuses_to_register(fake_site: FakeSite) -> None:
    """A plugin that stashes ``register`` and calls it once loading is over gets an error, not silence."""
    fake_site.add("keeper", "gptzoo_fake_keeper", "kept = []\n\n" + hook("kept.append(register)"))
    registry = gptzoo.get_registry(strict=True)
    with pytest.raises(gptzoo.PluginError) as excinfo:
        sys.modules["gptzoo_fake_keeper"].kept[0]("fine", object)
    assert str(excinfo.value) == (
        "gptzoo_fake_keeper (gptzoo-fake-keeper 1.0): register() was called after register_norms returned; call it "
        "inside the hook"
    )
    assert "fine" not in registry.names("norm")


@pytest.mark.parametrize(
    ("hook_name", "late_call"),
    [
        ("register_decode_lowerings", lambda register: register("torch.nn:Linear", lambda *a: None)),
        ("register_hf_layouts", lambda register: register("torch.nn:Linear", "llama", weights=lambda m: [])),
    ],
)
def test_a_lowering_or_layout_register_kept_past_its_hook_refuses_to_register(
    fake_site: FakeSite, hook_name: str, late_call: Callable[[Callable[..., None]], None]
) -> None:
    fake_site.add(
        "keeper",
        "gptzoo_fake_keeper",
        f"kept = []\n\n@gptzoo.hookimpl\ndef {hook_name}(register):\n    kept.append(register)\n",
    )
    gptzoo.get_registry(strict=True)
    with pytest.raises(gptzoo.PluginError) as excinfo:
        late_call(sys.modules["gptzoo_fake_keeper"].kept[0])
    assert str(excinfo.value) == (
        f"gptzoo_fake_keeper (gptzoo-fake-keeper 1.0): register() was called after {hook_name} returned; call it "
        "inside the hook"
    )


def test_an_unknown_name_among_many_lists_a_few(fake_site: FakeSite, capsys: pytest.CaptureFixture[str]) -> None:
    """20,000 registrations: the message keeps the did-you-mean and lists 20 names, then counts the rest."""
    fake_site.add("many", "gptzoo_fake_many", hook("for i in range(20000): register(f'n{i:05d}', object, doc='one')"))
    names = gptzoo.get_registry().names("norm")
    listing = f"{', '.join(names[:20])}, and {len(names) - 20} more: see `gptzoo list norm`"
    message = f"[model] norm: unknown norm 'n19999x'; did you mean 'n19999'? (available: {listing})"
    with pytest.raises(gptzoo.RecipeError) as excinfo:
        gptzoo.load_recipe("gpt2-tiny", ["model.norm=n19999x"], registry=gptzoo.get_registry())
    assert excinfo.value.problems == [message]
    assert run_error(capsys, "build", "gpt2-tiny", "--set", "model.norm=n19999x").endswith(message)


def test_a_multi_line_doc_is_kept_to_its_first_line(fake_site: FakeSite) -> None:
    fake_site.add("docs", "gptzoo_fake_docs", hook("register('fine', object, doc='  First line.\\nSecond.')"))
    assert gptzoo.get_registry(strict=True).get("norm", "fine").doc == "First line."


def test_plugin_exit_is_not_an_exception() -> None:
    """`except Exception` in a plugin's own code does not swallow the stand-in for os._exit."""
    assert issubclass(PluginExit, BaseException) and not issubclass(PluginExit, Exception)


# --- slow plugins ---------------------------------------------------------------------------------


def test_slow_import_is_named_on_stderr_once(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("slow", "gptzoo_fake_slow", "import time\ntime.sleep(1.5)\n" + SCALENORM)
    monkeypatch.setenv("GPTZOO_PLUGIN_WARN_S", "0.5")
    monkeypatch.setattr(plugin_manager, "load_factor", lambda: 1.0)  # an idle machine
    registry = gptzoo.get_registry()
    assert report(registry, "slow").status == "ok" and "scalenorm" in registry.names("norm")
    assert capsys.readouterr().err == (
        "warning: plugin 'slow' (module gptzoo_fake_slow, distribution gptzoo-fake-slow 1.0) is still importing "
        "after 0.5 s; it may only be slow (GPTZOO_PLUGIN_WARN_S sets how long to wait, 0 never warns); "
        "GPTZOO_NO_PLUGINS=1 or uninstalling gptzoo-fake-slow skips it\n"
    )


def test_a_loaded_machine_stretches_the_wait_before_a_plugin_is_named(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a load of 4 processes per core a plugin that imports in 1 s (0.25 s of an idle machine's
    0.5) is not blamed; one that takes 3 s is, after 2 s, and the line says why it waited."""
    monkeypatch.setenv("GPTZOO_PLUGIN_WARN_S", "0.5")
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * (os.cpu_count() or 1), 0.0, 0.0))
    fake_site.add("slow", "gptzoo_fake_slow", "import time\ntime.sleep(1.0)\n" + SCALENORM)
    gptzoo.get_registry()
    assert capsys.readouterr().err == ""
    fake_site.add(
        "slower", "gptzoo_fake_slower", "import time\ntime.sleep(3.0)\n" + SCALENORM.replace("scalenorm", "s2")
    )
    gptzoo.get_registry()
    assert capsys.readouterr().err == (
        "warning: plugin 'slower' (module gptzoo_fake_slower, distribution gptzoo-fake-slower 1.0) is still "
        "importing after 2 s (GPTZOO_PLUGIN_WARN_S=0.5, stretched for a load of 4 processes per core); it may only "
        "be slow (GPTZOO_PLUGIN_WARN_S sets how long to wait, 0 never warns); GPTZOO_NO_PLUGINS=1 or uninstalling "
        "gptzoo-fake-slower skips it\n"
    )


def test_slow_register_hook_is_named_on_stderr(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("slowreg", "gptzoo_fake_slowreg", hook("import time; time.sleep(0.8); register('fine', object)"))
    monkeypatch.setenv("GPTZOO_PLUGIN_WARN_S", "0.2")
    monkeypatch.setattr(plugin_manager, "load_factor", lambda: 1.0)  # an idle machine
    assert "fine" in gptzoo.get_registry().names("norm")
    assert capsys.readouterr().err == (
        "warning: plugin 'slowreg' (module gptzoo_fake_slowreg, distribution gptzoo-fake-slowreg 1.0) is still "
        "registering after 0.2 s; it may only be slow (GPTZOO_PLUGIN_WARN_S sets how long to wait, 0 never warns); "
        "GPTZOO_NO_PLUGINS=1 or uninstalling gptzoo-fake-slowreg skips it\n"
    )
    monkeypatch.setenv("GPTZOO_PLUGIN_WARN_S", "0")  # no warning at all
    gptzoo.get_registry()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_bad_warn_seconds_is_a_user_error(
    fake_site: FakeSite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    monkeypatch.setenv("GPTZOO_PLUGIN_WARN_S", value)
    assert run_error(capsys, "plugins") == (
        f"error: GPTZOO_PLUGIN_WARN_S={value!r} is not a number of seconds; set it to e.g. 5, or 0 for no warning"
    )
    monkeypatch.setenv("GPTZOO_NO_PLUGINS", "1")  # not read when no third-party plugin is loaded
    assert main(["plugins", "--json"]) == 0
    capsys.readouterr()


def test_default_registry_is_memoized_and_can_be_cleared() -> None:
    default_registry.cache_clear()
    first = default_registry()
    assert default_registry() is first and "rmsnorm" in first.names("norm")
    default_registry.cache_clear()
    assert default_registry() is not first


def test_a_plugins_message_reaches_the_terminal_escaped(
    fake_site: FakeSite, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_site.add("ansi", "gptzoo_fake_ansi", "raise RuntimeError('\\x1b[2J[bold]cleared\\nsecond line')\n")
    assert main(["list", "norm"]) == 0
    warning = capsys.readouterr().err.splitlines()[0]
    assert warning == (
        "warning: plugin 'ansi' (gptzoo-fake-ansi 1.0) failed: RuntimeError: \\x1b[2J[bold]cleared second line; "
        "see `gptzoo plugins`"
    )
