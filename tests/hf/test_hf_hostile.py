"""Hostile Hugging Face checkpoints: an index naming files outside the directory, malformed indexes
and configs, weights of the wrong dtype or with NaN, a pickle that asks for code. Each is one
message and exit status 2; nothing outside the checkpoint is read and nothing in a pickle runs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from cli_run import run_error, run_json
from safetensors.torch import load_file, save_file

from gptzoo.cli import main
from gptzoo.errors import CheckpointError, GptzooError, GptzooWarning
from gptzoo.hf import FAMILIES, hf_recipe, load_hf

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

INDEX = "model.safetensors.index.json"
RULE = "every file a checkpoint supplies must be inside its directory (after following symlinks)"


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random Llama saved whole and in shards (once for the module; tests copy them)."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=128,
        max_position_embeddings=64,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(root / "whole")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")
    return {"whole": root / "whole", "sharded": root / "sharded"}


@pytest.fixture
def make(originals: dict[str, Path], tmp_path: Path) -> Callable[[str, str], Path]:
    """A fresh copy of an original checkpoint under tmp_path/<name>."""

    def copy(kind: str, name: str = "ck") -> Path:
        return Path(shutil.copytree(originals[kind], tmp_path / name))

    return copy


def index_of(path: Path) -> dict:
    return json.loads((path / INDEX).read_text())


def write_index(path: Path, index: dict) -> None:
    (path / INDEX).write_text(json.dumps(index))


def first_shard(path: Path) -> tuple[str, str]:
    """(a tensor, its shard) of a sharded checkpoint's index, the first in index order."""
    return next(iter(index_of(path)["weight_map"].items()))


def assert_refused(capsys: pytest.CaptureFixture[str], path: Path, message: str) -> None:
    """load_hf raises exactly ``message``; `gptzoo build --hf PATH --out OUT` prints it, exits 2, writes nothing."""
    with pytest.raises(CheckpointError) as excinfo:
        load_hf(path)
    assert str(excinfo.value) == message
    out = path.parent / f"out-{path.name}"
    assert run_error(capsys, "build", "--hf", str(path), "--out", str(out)) == f"error: {message}"
    assert not out.exists()


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- sharded checkpoints: where the shards are ----------------------------------------------------


def test_a_sharded_checkpoint_loads_as_the_whole_one(make: Callable[..., Path]) -> None:
    sharded = make("sharded")
    assert len(set(index_of(sharded)["weight_map"].values())) > 2
    assert same_state(load_hf(sharded), load_hf(make("whole", "whole")))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
def test_a_shard_outside_the_directory_is_refused(
    make: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    path = make("sharded")
    tensor, shard = first_shard(path)
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(path / shard, outside)  # a perfectly good shard, but not the checkpoint's
    index = index_of(path)
    named = {"dotdot": "../elsewhere.safetensors", "absolute": str(outside), "symlink": shard}[how]
    if how == "symlink":
        os.symlink(outside, path / shard)
    index["weight_map"] = {k: named if v == shard else v for k, v in index["weight_map"].items()}
    write_index(path, index)
    assert_refused(
        capsys, path, f"{path / INDEX}: weight_map[{tensor!r}] = {named!r} names a file outside {path}; {RULE}"
    )


def test_symlinks_inside_the_directory_and_into_a_hub_cache_blobs_folder_are_fine(
    make: Callable[..., Path], originals: dict[str, Path], tmp_path: Path
) -> None:
    inside = make("sharded")
    _, shard = first_shard(inside)
    (inside / "real").mkdir()
    shutil.move(inside / shard, inside / "real" / shard)
    os.symlink(Path("real") / shard, inside / shard)
    reference = load_hf(make("whole", "whole"))
    assert same_state(load_hf(inside), reference)
    # huggingface_hub's cache: snapshots/REV/<file> -> ../../blobs/<hash>
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(originals["sharded"].iterdir())):
        shutil.copy(file, blobs / f"blob{i}")
        os.symlink(Path("..") / ".." / "blobs" / f"blob{i}", snapshot / file.name)
    assert same_state(load_hf(snapshot), reference)


def test_a_symlink_loop_is_refused(make: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make("sharded")
    tensor, shard = first_shard(path)
    (path / shard).unlink()
    os.symlink(path / "loop-b", path / shard)
    os.symlink(path / shard, path / "loop-b")
    with pytest.raises(CheckpointError) as excinfo:
        load_hf(path)
    assert str(excinfo.value) == f"{path / INDEX}: weight_map[{tensor!r}] = {shard!r} cannot be resolved " + (
        f"(Symlink loop from '{path / shard}')"
    )


def test_a_missing_shard_is_refused(make: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make("sharded")
    tensor, shard = first_shard(path)
    (path / shard).unlink()
    assert_refused(capsys, path, f"{path / INDEX}: weight_map[{tensor!r}] = {shard!r} names a shard that is missing")
    (path / shard).mkdir()  # a directory of that name is no better
    with pytest.raises(CheckpointError) as excinfo:
        load_hf(path)
    assert str(excinfo.value) == f"{path / INDEX}: weight_map[{tensor!r}] = {shard!r} names a directory, not a file"


@pytest.mark.parametrize(
    ("index", "message"),
    [
        (
            {"weight_map": ["model-00001.safetensors"]},
            "weight_map is not a non-empty object of tensor name -> shard file name",
        ),
        ({"metadata": {}}, "weight_map is not a non-empty object of tensor name -> shard file name"),
        ({"weight_map": {}}, "weight_map is not a non-empty object of tensor name -> shard file name"),
        ({"weight_map": {"lm_head.weight": 3}}, "weight_map['lm_head.weight'] = 3 is not a shard file name"),
        ({"weight_map": {"lm_head.weight": ""}}, "weight_map['lm_head.weight'] = '' is not a shard file name"),
        ([1, 2], None),
    ],
)
def test_a_malformed_index_is_refused(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], index: object, message: str | None
) -> None:
    path = make("sharded")
    (path / INDEX).write_text(json.dumps(index))
    expected = (
        f"{path / INDEX}: {message}" if message else f"{path / INDEX} is not a JSON object; fix or replace the index"
    )
    assert_refused(capsys, path, expected)


def test_an_index_that_is_not_json_is_refused(make: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make("sharded")
    (path / INDEX).write_text('{"weight_map": {')
    assert_refused(
        capsys,
        path,
        f"{path / INDEX} is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 17 "
        "(char 16); fix or replace the index",
    )


def test_shards_must_hold_what_the_index_says(make: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make("sharded")
    index = index_of(path)
    shards = sorted(set(index["weight_map"].values()))
    a, b = shards[0], shards[1]
    a_tensors, b_tensors = load_file(str(path / a)), load_file(str(path / b))
    stolen = sorted(b_tensors)[0]
    # a tensor stored in two shards: the index maps it to one, the other holds a shadow copy
    save_file({**a_tensors, stolen: torch.zeros_like(b_tensors[stolen])}, str(path / a))
    assert_refused(capsys, path, f"{path / INDEX}: shard {a!r} holds tensor {stolen!r}, but the index maps it to {b!r}")
    # a tensor the index does not list at all
    save_file({**a_tensors, "extra.weight": torch.zeros(2)}, str(path / a))
    with pytest.raises(CheckpointError) as excinfo:
        load_hf(path)
    assert (
        str(excinfo.value) == f"{path / INDEX}: shard {a!r} holds tensor 'extra.weight', but the index does not list it"
    )
    # a tensor the index places in a shard that does not hold it
    save_file(a_tensors, str(path / a))
    index["weight_map"][stolen] = a
    write_index(path, index)
    with pytest.raises(CheckpointError) as excinfo:
        load_hf(path)
    assert str(excinfo.value) == f"{path / INDEX}: weight_map[{stolen!r}] = {a!r}, but that shard does not hold it"


# --- tensors --------------------------------------------------------------------------------------

EMBED = "model.embed_tokens.weight"
DTYPES = "float32, bfloat16 or float16"


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t.to(torch.int32), f"{EMBED} has dtype int32, expected {DTYPES}"),
        (lambda t: t.bool(), f"{EMBED} has dtype bool, expected {DTYPES}"),
        (lambda t: t.to(torch.float64), f"{EMBED} has dtype float64, expected {DTYPES}"),
        (lambda t: t.to(torch.float8_e4m3fn), f"{EMBED} has dtype float8_e4m3fn, expected {DTYPES}"),
        (
            lambda t: t.to(torch.uint8).view(torch.float4_e2m1fn_x2),
            f"{EMBED} has dtype float4_e2m1fn_x2, expected {DTYPES}",
        ),
        (lambda t: t.index_fill(0, torch.tensor([3]), float("nan")), f"{EMBED} holds NaN or infinite values"),
        (lambda t: t.index_fill(0, torch.tensor([3]), float("inf")), f"{EMBED} holds NaN or infinite values"),
        (lambda t: t[:, :16].contiguous(), f"{EMBED} has shape (128, 16), expected (128, 32)"),
    ],
)
def test_weights_of_the_wrong_dtype_shape_or_value_are_refused(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], change, problem: str
) -> None:
    path = make("whole")
    tensors = load_file(str(path / "model.safetensors"))
    tensors[EMBED] = change(tensors[EMBED])
    save_file(tensors, str(path / "model.safetensors"))
    assert_refused(capsys, path, f"{path} does not fit LlamaForCausalLM 'ck': {problem}")


def test_float16_weights_are_converted(make: Callable[..., Path]) -> None:
    path = make("whole")
    tensors = load_file(str(path / "model.safetensors"))
    save_file({k: v.half() for k, v in tensors.items()}, str(path / "model.safetensors"))
    model = load_hf(path)
    assert model.wte.weight.dtype == torch.float32
    assert torch.equal(model.wte.weight, tensors[EMBED].half().float())


# --- pickles --------------------------------------------------------------------------------------


class Payload:
    """Unpickling this runs `touch <marker>`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def pickle_refused(path: Path, refusal: str) -> str:
    return (
        f"{path / 'pytorch_model.bin'} was refused: torch.load(weights_only=True) reads only tensors and plain "
        f"containers, and this pickle holds something else ({refusal}); nothing in it ran; use a "
        "model.safetensors from a source you trust"
    )


@pytest.mark.parametrize("writer", ["torch", "pickle"])
def test_a_pickle_that_asks_for_code_is_refused_unexecuted(
    make: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], writer: str
) -> None:
    path = make("whole")
    (path / "model.safetensors").unlink()
    marker = tmp_path / "pwned"
    state = {EMBED: torch.zeros(2), "x": Payload(marker)}
    if writer == "torch":
        torch.save(state, path / "pytorch_model.bin")
        refusal = "Trying to load unsupported GLOBAL posix.system whose module posix is blocked"
    else:
        (path / "pytorch_model.bin").write_bytes(pickle.dumps(state))
        refusal = "Unsupported operand 149"
    assert_refused(capsys, path, pickle_refused(path, refusal))
    assert not marker.exists()


def test_a_pickle_that_is_not_a_pickle_is_refused(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"\x00garbage")
    assert_refused(capsys, path, pickle_refused(path, "Unsupported operand 0"))


# --- config.json ----------------------------------------------------------------------------------

BEYOND = "(it is beyond a float's range)"
CONFIG_CASES = [
    ({"num_hidden_layers": "12"}, "config.json num_hidden_layers='12' is not a positive integer"),
    ({"num_hidden_layers": 1.0}, "config.json num_hidden_layers=1.0 is not a positive integer"),
    ({"num_hidden_layers": True}, "config.json num_hidden_layers=True is not a positive integer"),
    ({"vocab_size": -1}, "config.json vocab_size=-1 is not a positive integer"),
    ({"hidden_size": None}, "config.json has no 'hidden_size'"),
    ({"num_attention_heads": 0}, "config.json num_attention_heads=0 is not a positive integer"),
    (
        {"intermediate_size": [64] * 30},
        f"config.json intermediate_size={str([64] * 30)[:57]}... is not a positive integer",
    ),
    ({"rms_norm_eps": "1e-6"}, "config.json rms_norm_eps='1e-6' is not a finite number"),
    ({"rms_norm_eps": True}, "config.json rms_norm_eps=True is not a finite number"),
    ({"rms_norm_eps": None}, "config.json rms_norm_eps=None is not a finite number"),
    ({"initializer_range": "1e400"}, "config.json initializer_range=inf is not a finite number"),  # a JSON number
    ({"tie_word_embeddings": "false"}, "config.json tie_word_embeddings='false' is not true or false"),
    ({"attention_bias": 0}, "config.json attention_bias=0 is not true or false"),
    ({"rope_parameters": "abc"}, "config.json rope_parameters='abc' is not an object"),
    ({"rope_parameters": {"rope_theta": "x"}}, "config.json rope_parameters.rope_theta='x' is not a finite number"),
    (
        {"hidden_act": ["silu"]},
        "config.json hidden_act ['silu'] is not supported (available: silu, swish, gelu, gelu_pytorch_tanh, "
        "gelu_new, relu)",
    ),
    (
        {"num_hidden_layers": "2", "vocab_size": 0},
        "config.json vocab_size=0 is not a positive integer; "
        "config.json num_hidden_layers='2' is not a positive integer",
    ),
    ({"max_position_embeddings": 2**40}, "[model] context_length=1099511627776 must be between 1 and 2147483647"),
    # integers beyond a float: 10**400 is valid JSON, and float(10**400) overflows
    ({"rms_norm_eps": 10**400}, f"config.json rms_norm_eps=~1e400 is not a finite number {BEYOND}"),
    ({"initializer_range": -(10**400)}, f"config.json initializer_range=-~1e400 is not a finite number {BEYOND}"),
    (  # transformers 4.x writes rope_theta at the top level
        {"rope_parameters": None, "rope_theta": 10**400},
        f"config.json rope_theta=~1e400 is not a finite number {BEYOND}",
    ),
    (
        {"rope_parameters": {"rope_type": "default", "rope_theta": 10**400}},
        f"config.json rope_parameters.rope_theta=~1e400 is not a finite number {BEYOND}",
    ),
    (
        {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}},
        "config.json quantization_config={'quant_method': 'bitsandbytes', 'load_in_4bit': True} is not supported "
        f"(gptzoo reads plain {DTYPES} weights); use the checkpoint's unquantized weights",
    ),
]


@pytest.mark.parametrize(("change", "problem"), CONFIG_CASES)
def test_config_fields_of_the_wrong_type_or_range_are_refused_by_name(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], change: dict, problem: str
) -> None:
    path = make("whole")
    config = json.loads((path / "config.json").read_text())
    text = json.dumps({**config, **change}).replace('"1e400"', "1e400")  # valid JSON, read as float inf
    (path / "config.json").write_text(text)
    message = f"error: {path / 'config.json'}: {problem}"
    assert run_error(capsys, "build", "--hf", str(path)) == message


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "[" * 100_000 + "]" * 100_000,
            "maximum recursion depth exceeded while decoding a JSON array from a unicode string",
        ),
        ('{"rms_norm_eps": NaN}', "NaN is not a JSON value"),
        ('{"rms_norm_eps": -Infinity}', "-Infinity is not a JSON value"),
        ('{"model_type": "llama",', "Expecting property name enclosed in double quotes: line 1 column 24 (char 23)"),
    ],
)
def test_config_json_that_is_not_json_is_refused(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    path = make("whole")
    (path / "config.json").write_text(text)
    message = f"error: {path / 'config.json'} is not valid JSON: {problem}; fix or replace the config.json"
    assert run_error(capsys, "build", "--hf", str(path)) == message


def test_config_json_must_be_an_object_and_a_file(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    (path / "config.json").write_text("[1, 2]")
    assert run_error(capsys, "build", "--hf", str(path)) == (
        f"error: {path / 'config.json'} is not a JSON object; fix or replace the config.json"
    )
    (path / "config.json").unlink()
    assert run_error(capsys, "build", "--hf", str(path)) == (
        f"error: {path} is not a Hugging Face checkpoint: config.json is missing"
    )
    (path / "config.json").mkdir()
    assert run_error(capsys, "build", "--hf", str(path)) == f"error: {path / 'config.json'} is a directory, not a file"


def test_the_llama_config_still_derives_its_recipe(make: Callable[..., Path]) -> None:
    m = hf_recipe(make("whole")).model
    assert (m.n_layer, m.n_head, m.n_kv_head, m.n_embd, m.d_ff, m.vocab_size) == (1, 2, 1, 32, 64, 128)
    assert m.position.kwargs == {"theta": 10000.0} and not m.tie_embeddings


GPT2_CONFIG = {"model_type": "gpt2", "n_layer": 1, "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 128}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"layer_norm_epsilon": 10**400}, f"config.json layer_norm_epsilon=~1e400 is not a finite number {BEYOND}"),
        (
            {"n_embd": 2**30, "n_head": 1},
            "config.json n_embd=1073741824 makes the MLP width 4 x n_embd = 4294967296 (n_inner is unset), more than "
            "2147483647; n_embd or n_inner must be smaller",
        ),
    ],
)
def test_gpt2_config_fields_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict, problem: str
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**GPT2_CONFIG, **change}))
    assert run_error(capsys, "build", "--hf", str(tmp_path)) == f"error: {tmp_path / 'config.json'}: {problem}"


def test_a_config_without_model_type_says_so(make: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = make("whole")
    config = json.loads((path / "config.json").read_text())
    del config["model_type"]
    (path / "config.json").write_text(json.dumps(config))
    assert run_error(capsys, "build", "--hf", str(path)) == (
        f"error: {path}/config.json has no model_type; gptzoo reads checkpoints of model_type {', '.join(FAMILIES)}"
    )


# --- every file a checkpoint directory supplies ---------------------------------------------------


@pytest.mark.parametrize("name", ["model.safetensors", "pytorch_model.bin", "config.json"])
def test_single_files_symlinked_outside_the_directory_are_refused(
    make: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    path = make("whole")
    if name == "pytorch_model.bin":
        torch.save(load_file(str(path / "model.safetensors")), path / name)
        (path / "model.safetensors").unlink()
    outside = tmp_path / f"elsewhere-{name}"
    shutil.move(path / name, outside)  # a perfectly good file, but not the checkpoint's
    os.symlink(outside, path / name)
    assert_refused(capsys, path, f"{path / name} links to {outside}, outside {path}; {RULE}")


UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
"""Root reads files it may not: without these two capabilities it is refused as anyone is."""
UNREADABLE = """
import contextlib, io, json, os, sys
from gptzoo.cli import main
messages = []
for name, argv in json.loads(sys.argv[1]):
    os.chmod(name, 0)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    os.chmod(name, 0o755 if os.path.isdir(name) else 0o644)
    messages.append([code, err.getvalue()])
print(json.dumps(messages))
"""


@pytest.mark.skipif(bool(UNPRIVILEGED) and shutil.which("setpriv") is None, reason="root, and no setpriv")
def test_files_that_cannot_be_read_are_named_as_such(make: Callable[..., Path], tmp_path: Path) -> None:
    path = make("whole")
    save_word_tokenizer(path)
    ck, out = tmp_path / "built", tmp_path / "out"
    assert main(["build", "--hf", str(path), "--out", str(ck)]) == 0
    (path / "sub").mkdir()
    generate = ["generate", "--hf", str(path), "--prompt", "w1", "--max-new-tokens", "1"]
    cases = [
        (path / "config.json", generate),
        (path / "model.safetensors", generate),
        (path / "tokenizer_config.json", ["build", "--hf", str(path), "--out", str(out)]),
        (path / "sub", generate),
        (ck / "model.safetensors", ["generate", "--checkpoint", str(ck), "--prompt", "w1"]),
        (ck / "recipe.toml", ["export", str(ck), "--hf", str(out)]),
    ]
    done = subprocess.run(
        [*UNPRIVILEGED, sys.executable, "-c", UNREADABLE, json.dumps([(str(f), argv) for f, argv in cases])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[2, f"error: cannot read {f}: Permission denied\n"] for f, _ in cases]
    assert not out.exists()


def test_weights_that_are_not_regular_files_are_refused_unopened(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    weights = path / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)  # opening it would block forever
    assert_refused(capsys, path, f"{weights} is a named pipe (FIFO), not a file")
    weights.unlink()
    weights.mkdir()
    assert_refused(capsys, path, f"{weights} is a directory, not a file")
    weights.rmdir()
    os.symlink("/dev/zero", weights)
    assert_refused(capsys, path, f"{weights} links to /dev/zero, outside {path}; {RULE}")
    weights.unlink()
    os.symlink(path / "nothing", weights)
    assert_refused(capsys, path, f"{weights} is a symbolic link to nothing ({path / 'nothing'} does not exist)")


@pytest.mark.parametrize(("name", "reason"), [("a\u0000b", "embedded null byte"), ("a" * 5000, "File name too long")])
def test_index_entries_the_system_cannot_use_are_named(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], name: str, reason: str
) -> None:
    path = make("sharded")
    index = index_of(path)
    tensor = next(iter(index["weight_map"]))
    index["weight_map"][tensor] = name
    write_index(path, index)
    shown = repr(name) if len(repr(name)) <= 300 else repr(name)[:297] + "..."
    assert_refused(capsys, path, f"{path / INDEX}: weight_map[{tensor!r}] = {shown} cannot be resolved ({reason})")


def test_an_index_whose_metadata_is_not_an_object_is_refused(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("sharded")
    write_index(path, {**index_of(path), "metadata": "x"})
    assert_refused(capsys, path, f"{path / INDEX}: metadata='x' is not an object; fix or remove it")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda t: t.to_sparse(), "is a sparse_coo tensor; a checkpoint's weights are dense tensors"),
        (
            lambda t: torch.empty(t.shape, device="meta"),
            "is a meta tensor, which holds no values; a checkpoint's weights hold their values",
        ),
    ],
)
def test_pickled_tensors_must_be_dense_and_hold_values(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], change, problem: str
) -> None:
    path = make("whole")
    state = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    state["model.norm.weight"] = change(state["model.norm.weight"])
    torch.save(state, path / "pytorch_model.bin")
    assert_refused(capsys, path, f"{path / 'pytorch_model.bin'}: 'model.norm.weight' {problem}")


def test_many_tensors_of_a_refused_dtype_are_counted(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    tensors = load_file(str(path / "model.safetensors"))
    save_file({k: v.to(torch.float8_e5m2) for k, v in tensors.items()}, str(path / "model.safetensors"))
    first = sorted(tensors)[:3]
    assert_refused(
        capsys,
        path,
        f"{path} does not fit LlamaForCausalLM 'ck': {len(tensors)} tensors ({', '.join(first)}, and "
        f"{len(tensors) - 3} more) have dtype float8_e5m2, expected {DTYPES}",
    )


def test_a_tied_head_that_differs_from_the_embedding_names_the_directory(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    assert_refused(
        capsys,
        path,
        f"{path}: lm_head.weight differs from the token embedding {EMBED}, but config.json ties them "
        "(tie_word_embeddings); set tie_word_embeddings to false if the head is its own",
    )


def test_a_home_directory_of_no_user_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("~nosuchuser-gptzoo/x", "~nosuchuser-gptzoo"):
        assert run_error(capsys, "generate", "--hf", text, "--prompt", "hi") == (
            f"error: no such checkpoint directory: {text} (~nosuchuser-gptzoo names no user on this machine)"
        )


def test_a_directory_name_that_is_not_utf8_is_named(
    originals: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def refused(name: str) -> str:
        return (
            f"error: the directory name {name!r} is not valid UTF-8 (byte 0xff at character {len(name) - 1}), and "
            "safetensors reads and writes only UTF-8 paths; rename it"
        )

    path = shutil.copytree(originals["whole"], os.fsdecode(bytes(tmp_path) + b"/ck\xff"))
    assert run_error(capsys, "generate", "--hf", path, "--prompt", "hi") == refused(path)
    out = os.fsdecode(bytes(tmp_path) + b"/out\xff")
    assert run_error(capsys, "build", "gpt2-tiny", "--out", out) == refused(out)
    assert run_error(capsys, "export", path, "--hf", out) == refused(path)
    assert not os.path.lexists(out)


# --- tokenizers, chat templates and compare -------------------------------------------------------


def save_word_tokenizer(directory: Path, n_words: int = 200) -> None:
    """A word-level HF tokenizer of ids 0 (<unk>) .. n_words - 1 (w1, w2, ...) into ``directory``."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, n_words)}}
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>").save_pretrained(directory)


def test_tokenizer_files_symlinked_outside_the_directory_are_refused(
    make: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    save_word_tokenizer(path)
    outside = tmp_path / "elsewhere.json"
    shutil.move(path / "tokenizer.json", outside)
    os.symlink(outside, path / "tokenizer.json")
    assert run_error(capsys, "generate", "--hf", str(path), "--prompt", "w1") == (
        f"error: {path / 'tokenizer.json'} links to {outside}, outside {path}; {RULE}"
    )


FIX = "remove the entry, or name a file inside {} relative to it"


@pytest.mark.parametrize(
    ("entry", "value", "refusal"),
    [
        ("fast_tokenizer_files", ["../outside/tokenizer.1.json"], "names a file outside {path}; {RULE}"),
        ("fast_tokenizer_files", ["{outside}/tokenizer.1.json"], "is an absolute path; {RULE}"),
        ("vocab_file", "sub/../../outside/tokenizer.1.json", "names a file outside {path}; {RULE}"),
        (
            "init_kwargs",
            {"merges_file": "ok.txt", "tokenizer_file": "x\u0000"},
            "cannot be resolved (embedded null byte)",
        ),
        ("special_tokens_map_file", ".", "names a directory, not a file"),
    ],
)
def test_file_names_in_tokenizer_config_json_must_lead_inside(
    make: Callable[..., Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    entry: str,
    value: object,
    refusal: str,
) -> None:
    path = make("whole")
    save_word_tokenizer(path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(path / "tokenizer.json", outside / "tokenizer.1.json")  # transformers would read it instead
    value = json.loads(json.dumps(value).replace("{outside}", str(outside)))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, entry: value, "tokenizer_file": None}))
    where = {"fast_tokenizer_files": f"{entry}[0]", "init_kwargs": "init_kwargs.tokenizer_file"}.get(entry, entry)
    shown = value[0] if isinstance(value, list) else value["tokenizer_file"] if isinstance(value, dict) else value
    refused = refusal.format(path=path, RULE=RULE)
    message = f"{path / 'tokenizer_config.json'}: {where} = {shown!r} {refused}: {FIX.format(path)}"
    assert run_error(capsys, "generate", "--hf", str(path), "--prompt", "w1") == f"error: {message}"
    (tmp_path / "text.txt").write_text("w1 w2")
    data = tmp_path / "data"
    assert run_error(capsys, "prepare", str(tmp_path / "text.txt"), "--tokenizer", str(path), "--out", str(data)) == (
        f"error: {message}"
    )
    assert run_error(capsys, "build", "--hf", str(path), "--out", str(tmp_path / "ck2")) == f"error: {message}"
    assert not data.exists() and not (tmp_path / "ck2").exists()


def test_a_checkpoint_built_before_keeps_its_tokenizer_config_checked(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    save_word_tokenizer(path)
    ck = path.parent / "built"
    assert main(["build", "--hf", str(path), "--out", str(ck)]) == 0
    config = json.loads((ck / "tokenizer_config.json").read_text())
    (ck / "tokenizer_config.json").write_text(json.dumps({**config, "fast_tokenizer_files": ["../ck/tokenizer.json"]}))
    message = (
        f"{ck / 'tokenizer_config.json'}: fast_tokenizer_files[0] = '../ck/tokenizer.json' names a file outside "
        f"{ck}; {RULE}: {FIX.format(ck)}"
    )
    capsys.readouterr()
    assert run_error(capsys, "generate", "--checkpoint", str(ck), "--prompt", "w1") == f"error: {message}"
    assert run_error(capsys, "export", str(ck), "--hf", str(path.parent / "ex")) == f"error: {message}"
    (ck / "tokenizer_config.json").write_text(json.dumps({**config, "fast_tokenizer_files": ["tokenizer.json"]}))
    assert len(run_json(capsys, "generate", "--checkpoint", str(ck), "--prompt", "w1", "--max-new-tokens", "1")) > 0


def test_every_entry_of_every_subdirectory_is_held_to_the_rule(
    make: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")
    save_word_tokenizer(path)
    (tmp_path / "secret.jinja").write_text('{{ "SECRET" }}')
    templates = path / "additional_chat_templates"
    templates.mkdir()
    (templates / "a.jinja").write_text("{{ messages[0].content }}")
    (templates / "sub").mkdir()
    os.symlink("..", templates / "sub" / "loop")  # inside: listed once
    os.symlink(templates / "sub", path / "elsewhere")
    argv = ["generate", "--hf", str(path), "--prompt", "w1", "--max-new-tokens", "1"]
    assert len(run_json(capsys, *argv)["tokens"][0]) == 1
    os.symlink(tmp_path / "secret.jinja", templates / "sub" / "x.jinja")
    assert run_error(capsys, *argv) == (
        f"error: {templates / 'sub' / 'x.jinja'} links to {tmp_path / 'secret.jinja'}, outside {path}; {RULE}"
    )
    (templates / "sub" / "x.jinja").unlink()
    os.mkfifo(templates / "sub" / "x.jinja")  # transformers would block reading it
    assert run_error(capsys, *argv) == f"error: {templates / 'sub' / 'x.jinja'} is a named pipe (FIFO), not a file"
    (templates / "sub" / "x.jinja").unlink()
    os.symlink(tmp_path, templates / "sub" / "up")  # a symlinked subdirectory outside
    assert run_error(capsys, *argv) == f"error: {templates / 'sub' / 'up'} links to {tmp_path}, outside {path}; {RULE}"


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ('{{ 1 + "a" }}', "TypeError: unsupported operand type(s) for +: 'int' and 'str'"),
        ("{{ 1 // 0 }}", "ZeroDivisionError: integer division or modulo by zero"),
        (
            "{% for i in range(10**9) %}x{% endfor %}",
            "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).",
        ),
        ('{% include "x.jinja" %}', "TypeError: no loader for this environment specified"),
        ("{% for %}", "TemplateSyntaxError: Expected an expression, got 'end of statement block'"),
    ],
)
def test_a_chat_template_that_fails_names_its_file(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str], template: str, problem: str
) -> None:
    path = make("whole")
    save_word_tokenizer(path)
    (path / "chat_template.jinja").write_text(template)
    assert run_error(capsys, "generate", "--hf", str(path), "--prompt", "w1", "--chat") == (
        f"error: the chat template in {str(path / 'chat_template.jinja')!r} failed ({problem}); "
        "fix or replace the template"
    )


def compare_ids(path: Path) -> dict:
    from gptzoo.hf.compare import compare

    return compare(path, prompts=[[1, 2, 3]], new_tokens=2)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"use_cache": "no"},
            "StrictDataclassFieldValidationError: Validation error for field 'use_cache': TypeError: Field "
            "'use_cache' expected bool, got str (value: 'no')",
        ),
        ({"bos_token_id": "x"}, "StrictDataclassFieldValidationError: Validation error for field 'bos_token_id'"),
        ({"eos_token_id": [2, "x"]}, "StrictDataclassFieldValidationError: Validation error for field 'eos_token_id'"),
    ],
)
def test_compare_names_what_transformers_refuses(make: Callable[..., Path], change: dict, problem: str) -> None:
    path = make("whole")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError) as excinfo:
        compare_ids(path)
    assert str(excinfo.value).startswith(f"transformers refuses {path}/config.json: {problem}")
    assert str(excinfo.value).endswith(
        "(compare runs the checkpoint in transformers as well: fix config.json, or run it with gptzoo alone, "
        "e.g. gptzoo generate --hf)"
    )


def test_compare_runs_transformers_own_attention(make: Callable[..., Path]) -> None:
    path = make("whole")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "_attn_implementation": "flash_attention_2"}))
    result = compare_ids(path)  # flash-attn is not installed: transformers would refuse to load
    assert result["greedy_match"] and result["max_abs_diff"] < 1e-4


def test_compare_checks_prompt_ids_against_the_vocabulary(
    make: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make("whole")  # vocab_size 128
    save_word_tokenizer(path, 200)
    assert run_error(capsys, "compare", "--hf", str(path), "--prompt", "w1 w150", "--new-tokens", "2") == (
        "error: prompt 1 has token id 150, outside the model's vocabulary (vocab_size 128), while the hf tokenizer "
        "has 200 ids; give the model a vocab_size of at least 200 or use the tokenizer it was trained with"
    )
    from gptzoo.hf.compare import compare

    with pytest.raises(GptzooError) as excinfo:
        compare(path, prompts=[[1], [5, 128]], new_tokens=2)
    assert str(excinfo.value) == "prompt 2 has token id 128, outside the model's vocabulary (0..127)"
    with pytest.warns(GptzooWarning) as caught:  # RoPE runs past the trained context, as transformers does
        past = compare(path, prompts=[[1] * 63], new_tokens=2)
    assert {str(w.message) for w in caught} == {  # once a command (or Python's default filter) shows it
        "sequences of 65 tokens are longer than the context length 64 the model was trained at: its positions "
        "encode any length, so they run, but expect worse results past 64 tokens"
    }
    assert past["greedy_match"] and past["max_abs_diff"] < 1e-4
