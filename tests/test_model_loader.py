"""Model directory loading, both train.yaml layouts, clear errors, model variants, training loss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from asr_core.model import ASRModel, ModelConfigError, ModelLoadError, load_wenet_model
from asr_core.model.cmvn import GlobalCMVN, load_cmvn
from asr_core.model.config import load_model_config, parse_model_config
from asr_core.model.embedding import sinusoid
from asr_core.offline import encode_full

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "wenet_u2pp_small"
MODEL = FIXTURE / "model"
pytestmark = pytest.mark.skipif(not (MODEL / "final.pt").is_file(), reason=f"WeNet fixture not found at {FIXTURE}")


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fbank() -> torch.Tensor:
    with np.load(FIXTURE / "expected.npz") as npz:
        return torch.from_numpy(npz["utt1__fbank"])


@pytest.fixture(scope="module")
def reference(fbank: torch.Tensor) -> torch.Tensor:
    with np.load(FIXTURE / "expected.npz") as npz:
        return torch.from_numpy(npz["utt1__encoder_out_full"])


def copy_model(tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(MODEL, target)
    return target


def edit_yaml(model_dir: Path, edit: Any) -> None:
    data = yaml.safe_load((model_dir / "train.yaml").read_text())
    edit(data)
    (model_dir / "train.yaml").write_text(yaml.safe_dump(data))


def edit_state(model_dir: Path, edit: Any) -> None:
    state = torch.load(model_dir / "final.pt", weights_only=True)
    edit(state)
    torch.save(state, model_dir / "final.pt")


def test_loaded_model_facts() -> None:
    loaded = load_wenet_model(MODEL)
    assert not loaded.model.training
    assert (loaded.vocab_size, loaded.blank_id, loaded.sos_id, loaded.eos_id) == (60, 0, 59, 59)
    assert (loaded.num_blocks, loaded.heads, loaded.d_k, loaded.d_model) == (4, 4, 32, 128)
    assert (loaded.cnn_cache_frames, loaded.subsampling, loaded.right_context) == (14, 4, 6)
    assert loaded.units[0] == "<blank>" and loaded.units[2] == "我" and loaded.units[59] == "<sos/eos>"


def test_checkpoint_with_sinusoid_buffers(tmp_path: Path, fbank: torch.Tensor, reference: torch.Tensor) -> None:
    model_dir = copy_model(tmp_path)
    table = sinusoid(torch.arange(5000), 128)[None]

    def add_pe(state: dict[str, torch.Tensor]) -> None:
        for key in ("encoder.embed.pos_enc.pe", "decoder.left_decoder.embed.1.pe", "decoder.right_decoder.embed.1.pe"):
            state[key] = table

    edit_state(model_dir, add_pe)
    assert float((encode_full(load_wenet_model(model_dir), fbank) - reference).abs().max()) <= 1e-5


def test_older_train_yaml_layout_keeps_cmvn(tmp_path: Path, fbank: torch.Tensor, reference: torch.Tensor) -> None:
    """2021-2023 layout: top-level cmvn_file/is_json_cmvn, no tokenizer_conf. The checkpoint's
    CMVN buffers are removed too, so the statistics must come from global_cmvn."""
    model_dir = copy_model(tmp_path)

    def to_old_layout(data: dict[str, Any]) -> None:
        for key in ("cmvn", "cmvn_conf", "tokenizer", "tokenizer_conf", "vocab_size"):
            data.pop(key)
        data["cmvn_file"] = "/home/someone/exp/data/train/global_cmvn"
        data["is_json_cmvn"] = True

    edit_yaml(model_dir, to_old_layout)
    edit_state(model_dir, lambda s: [s.pop(k) for k in ("encoder.global_cmvn.mean", "encoder.global_cmvn.istd")])
    loaded = load_wenet_model(model_dir)
    assert loaded.model.encoder.global_cmvn is not None
    assert (loaded.sos_id, loaded.eos_id, loaded.blank_id) == (59, 59, 0)
    assert float((encode_full(loaded, fbank) - reference).abs().max()) <= 1e-4


def test_kaldi_text_cmvn_equals_json(tmp_path: Path) -> None:
    stats = json.loads((MODEL / "global_cmvn").read_text())
    kaldi = tmp_path / "cmvn.ark"
    mean_row = " ".join(repr(v) for v in stats["mean_stat"])
    var_row = " ".join(repr(v) for v in stats["var_stat"])
    kaldi.write_text(f" [\n  {mean_row} {stats['frame_num']}\n  {var_row} 0 ]\n")
    json_mean, json_istd = load_cmvn(MODEL / "global_cmvn", is_json=True)
    kaldi_mean, kaldi_istd = load_cmvn(kaldi, is_json=False)
    assert torch.equal(json_mean, kaldi_mean) and torch.equal(json_istd, kaldi_istd)
    loaded = load_wenet_model(MODEL)
    assert loaded.model.encoder.global_cmvn is not None
    assert torch.allclose(loaded.model.encoder.global_cmvn.mean, json_mean)
    assert torch.allclose(loaded.model.encoder.global_cmvn.istd, json_istd)


@pytest.mark.parametrize("name", ["train.yaml", "final.pt", "units.txt", "global_cmvn"])
def test_missing_file(tmp_path: Path, name: str) -> None:
    model_dir = copy_model(tmp_path)
    (model_dir / name).unlink()
    with pytest.raises(ModelLoadError, match=f"model dir .*: missing {name}"):
        load_wenet_model(model_dir)


def test_checkpoint_mismatches_are_listed(tmp_path: Path) -> None:
    model_dir = copy_model(tmp_path)

    def damage(state: dict[str, torch.Tensor]) -> None:
        state["encoder.encoders.0.self_attn.linear_extra.weight"] = torch.zeros(2)
        del state["decoder.right_decoder.output_layer.bias"]
        state["ctc.ctc_lo.bias"] = torch.zeros(61)

    edit_state(model_dir, damage)
    with pytest.raises(ModelLoadError) as info:
        load_wenet_model(model_dir)
    message = str(info.value)
    assert "unexpected keys: encoder.encoders.0.self_attn.linear_extra.weight" in message
    assert "missing keys: decoder.right_decoder.output_layer.bias" in message
    assert "shape mismatch for ctc.ctc_lo.bias: checkpoint (61,), train.yaml implies (60,)" in message


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            ("encoder",),
            "squeezeformer",
            r"unsupported value 'squeezeformer' for encoder; allowed: 'conformer' or 'transformer'",
        ),
        (
            ("encoder_conf", "pos_enc_layer_type"),
            "rope_pos",
            r"encoder_conf.pos_enc_layer_type; allowed: 'rel_pos' or 'abs_pos'",
        ),
        (("encoder_conf", "selfattention_layer_type"), "rope_abs_selfattn", r"allowed: 'rel_selfattn' or 'selfattn'"),
        (("encoder_conf", "input_layer"), "conv1d2", r"allowed: 'conv2d', 'conv2d6' or 'conv2d8'"),
        (("encoder_conf", "cnn_module_norm"), "group_norm", r"allowed: 'layer_norm' or 'batch_norm'"),
        (("encoder_conf", "causal"), False, r"causal: false is not supported for a streaming model"),
        (("encoder_conf", "n_kv_head"), 2, r"unsupported option encoder_conf.n_kv_head"),
        (("decoder",), "transducer", r"for decoder; allowed: 'bitransformer' or 'transformer'"),
    ],
)
def test_unsupported_options(tmp_path: Path, path: tuple[str, ...], value: object, expected: str) -> None:
    model_dir = copy_model(tmp_path)

    def set_option(data: dict[str, Any]) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    edit_yaml(model_dir, set_option)
    with pytest.raises(ModelConfigError, match=expected) as info:
        load_wenet_model(model_dir)
    assert f"{model_dir / 'train.yaml'}:" in str(info.value)


def test_config_error_names_the_line(tmp_path: Path) -> None:
    text = (MODEL / "train.yaml").read_text().replace("cnn_module_norm: layer_norm", "cnn_module_norm: rms_norm")
    lineno = next(i for i, line in enumerate(text.splitlines(), 1) if "rms_norm" in line)
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(ModelConfigError, match=f"train.yaml:{lineno}: unsupported value 'rms_norm'"):
        load_model_config(path)


def random_model(edit: Any) -> ASRModel:
    data = yaml.safe_load((MODEL / "train.yaml").read_text())
    data["encoder_conf"].update(output_size=32, linear_units=48, num_blocks=2, cnn_module_kernel=5)
    data["decoder_conf"].update(linear_units=48)
    edit(data)
    config = parse_model_config(data, Path("train.yaml"))
    torch.manual_seed(3)
    cmvn = GlobalCMVN(torch.randn(80), torch.rand(80) + 0.5)
    return ASRModel(config, cmvn).eval()


@pytest.mark.parametrize(
    "encoder_conf",
    [
        {"input_layer": "conv2d6", "cnn_module_norm": "batch_norm"},
        {"input_layer": "conv2d8"},
        {"pos_enc_layer_type": "abs_pos", "selfattention_layer_type": "selfattn"},
        {"macaron_style": False, "use_cnn_module": False},
    ],
)
@pytest.mark.parametrize("encoder", ["conformer", "transformer"])
def test_variants_stream_like_their_chunk_mask(encoder: str, encoder_conf: dict[str, Any]) -> None:
    """Streaming with caches equals the chunk-masked whole-utterance forward for every variant."""

    def edit(data: dict[str, Any]) -> None:
        data["encoder"] = encoder
        data["encoder_conf"].update(encoder_conf)

    model = random_model(edit)
    encoder_module = model.encoder
    for module in encoder_module.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            assert module.running_mean is not None and module.running_var is not None
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    xs = torch.randn(1, 150, 80)
    with torch.inference_mode():
        for chunk, left in ((4, 2), (3, -1)):
            masked, _ = encoder_module(xs, torch.tensor([150]), chunk, left)
            streamed, _ = encoder_module.forward_chunk_by_chunk(xs, chunk, left)
            frames = streamed.size(1)
            assert frames == masked.size(1)
            assert float((masked - streamed).abs().max()) <= 1e-4


def test_training_loss() -> None:
    model = random_model(lambda data: None).train()
    speech = torch.randn(3, 120, 80)
    speech_lengths = torch.tensor([120, 100, 77])
    text = torch.tensor([[5, 6, 7, 8], [9, 10, -1, -1], [11, -1, -1, -1]])
    text_lengths = torch.tensor([4, 2, 1])
    torch.manual_seed(0)
    out = model(speech, speech_lengths, text, text_lengths)
    loss, loss_ctc, loss_att = out["loss"], out["loss_ctc"], out["loss_att"]
    assert loss is not None and loss_ctc is not None and loss_att is not None
    assert torch.isfinite(loss)
    assert torch.allclose(loss, 0.3 * loss_ctc + 0.7 * loss_att)
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    assert grads["encoder.encoders.0.self_attn.linear_pos.weight"] is not None
    assert grads["decoder.right_decoder.output_layer.weight"] is not None
