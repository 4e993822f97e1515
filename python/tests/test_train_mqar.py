"""examples/train_mqar.py end to end at a CI size (about 20 s on 2 CPU cores):
a small GatedDeltaNet model trained on MQAR with the gdn kernels and with
gdn.torch_ref from the same parameters and data, in float32 on the CPU. The
two loss curves agree step by step, the loss falls, recall is well above
chance, and cached decode gives the logits of a full prefill."""
import importlib.util
import os

import pytest

pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "examples", "train_mqar.py")

# A smaller task than the script's defaults (4 pairs of 8 keys / 8 values, seq_len 16, d_model 64), so
# that the slow token-by-token torch reference trains too within the time. The seed is fixed rather than
# GDN_TEST_SEED's: the checks are about one training curve, and how soon a run starts to recall varies
# from seed to seed (seeds 0-4 end at recall accuracy 0.71-0.93 here, chance 0.125). How far the two
# loss curves drift apart is a property of the training run too: where training amplifies float32
# rounding (the script's default run: 1e-3 to 1e-2 relative after 100 steps, as much as a 1e-7 change of
# one weight gives), no kernel tolerance holds; this run does not amplify it, and seed 0's losses agree
# to ~6e-6.
FLAGS = ["--kernel", "both", "--device", "cpu", "--dtype", "f32", "--steps", "100", "--seq-len", "16",
         "--pairs", "4", "--keys", "8", "--values", "8", "--d-model", "64", "--head-dim", "32", "--batch", "64",
         "--lr", "3e-3", "--warmup", "20", "--seed", "0", "--quiet"]
LOSS_RTOL = 1e-4        # per step, |loss_gdn - loss_torch| / loss_torch, every step
DECODE_ATOL = 1e-4      # max |decode logit - prefill logit| (logits of size ~5)


def load_script():
    spec = importlib.util.spec_from_file_location("train_mqar", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result():
    if not os.path.exists(SCRIPT):
        pytest.skip("examples/train_mqar.py is not beside the tests")
    return load_script().main(FLAGS)


def test_kernels_agree_every_step(result):
    a, b = result["runs"]["gdn"]["loss"], result["runs"]["torch"]["loss"]
    assert len(a) == len(b) == 100
    worst = max(range(len(a)), key=lambda i: abs(a[i] - b[i]) / abs(b[i]))
    rel = abs(a[worst] - b[worst]) / abs(b[worst])
    assert rel <= LOSS_RTOL, f"step {worst}: loss gdn {a[worst]:.6f}, torch {b[worst]:.6f} (relative {rel:.2e})"
    assert result["max_rel_loss_diff"] == pytest.approx(rel)


@pytest.mark.parametrize("kernel", ["gdn", "torch"])
def test_loss_falls_and_recall_is_learned(result, kernel):
    run = result["runs"][kernel]
    first, last = sum(run["loss"][:10]) / 10, sum(run["loss"][-10:]) / 10
    assert last < 0.5 * first, f"{kernel}: mean loss of the first 10 steps {first:.3f}, of the last 10 {last:.3f}"
    chance = result["chance"]
    assert run["final_acc"] > 3 * chance, f"{kernel}: final recall accuracy {run['final_acc']:.3f}, chance {chance:.3f}"
    assert run["decode_acc"] > 3 * chance, f"{kernel}: recall by decode {run['decode_acc']:.3f}, chance {chance:.3f}"


@pytest.mark.parametrize("kernel", ["gdn", "torch"])
def test_decode_matches_prefill(result, kernel):
    run = result["runs"][kernel]
    assert run["decode_max_abs_diff"] < DECODE_ATOL, (
        f"{kernel}: cached decode vs prefill logits differ by {run['decode_max_abs_diff']:.2e} "
        f"(largest logit {run['prefill_max_abs_logit']:.1f})")


def test_plot(result, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "mqar.png"
    load_script().plot(str(path), result["runs"], result["chance"], "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
