"""The example engine (examples/engine): a Llama-architecture model in
PyTorch whose engine processes share one kvshare cache, checked against the
same model run from scratch with no cache.  Skipped, saying so, without
PyTorch."""
import io
import json
import os
import sys
import time
from contextlib import redirect_stdout

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed "
                            "(Debian: python3-torch)")

import kvshare  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ENGINE = os.path.join(os.path.dirname(HERE), "examples", "engine")
sys.path.insert(0, ENGINE)

import model as M  # noqa: E402
import run as R  # noqa: E402
from engine import Engine  # noqa: E402

from conftest import BUILD  # noqa: E402

SMALL_RUN = ["--build", BUILD, "--engines", "2", "--model", "tiny",
             "--conversations", "4", "--turns", "3", "--system", "48",
             "--user", "24", "--reply", "6", "--chunk", "64", "--json"]


def run_json(args):
    out = io.StringIO()
    with redirect_stdout(out):
        rc = R.main(args)
    return rc, json.loads(out.getvalue())


# The sanitizer build's run of this suite (test_python.sh preloads ASan into
# python and says so in KVS_PY_CHILD_LD_PRELOAD) keeps the library-level
# tests and leaves the whole-engine run to the plain build: four engine
# processes of PyTorch under the ASan runtime add half a minute and no
# check test_torch.py does not already make there.
SANITIZED = "KVS_PY_CHILD_LD_PRELOAD" in os.environ


@pytest.mark.skipif(SANITIZED, reason="sanitizer build: the plain build "
                    "runs the whole engine (test_torch covers libkvshare "
                    "under ASan)")
def test_modes_faults_and_weights_file(tmp_path):
    """No cache and shared, then the faults run (a pool too small, a host
    tier, an engine killed mid-step), weights from a safetensors file: every
    answer equals the from-scratch model's, the shared cache served
    prefixes another engine computed and prefilled less, every daemon
    ended clean."""
    cfg = M.CONFIGS["tiny"]
    path = tmp_path / "tiny.safetensors"
    M.save_safetensors(str(path), M.seeded_weights(cfg, 7))
    rc, rep = run_json(SMALL_RUN + ["--modes", "none,shared", "--faults",
                                    "--kill-at-step", "3",
                                    "--weights", str(path)])
    assert rep["failures"] == [] and rc == 0, rep["failures"]
    runs = {r["mode"]: r for r in rep["runs"]}
    assert set(runs) == {"none", "shared", "shared + faults"}
    for r in runs.values():
        assert r["requests"] == r["checked"] == 4 * 3
        assert r["pool_check"] and r["blocks_in_use"] == 0
        assert r["daemon_exit"] == [0]
        assert r["generated_tokens"] == 4 * 3 * 6
    assert runs["none"]["hit_tokens"] == 0
    assert runs["none"]["prefill_tokens"] == runs["none"]["prompt_tokens"]
    assert runs["shared"]["from_other_engine"] > 0
    assert runs["shared"]["prefill_tokens"] < runs["none"]["prefill_tokens"]
    f = runs["shared + faults"]
    assert f["killed_engines"] == 1 and f["evictions"] > 0
    assert f["tier_promotions"] > 0


def test_the_check_catches_a_wrong_answer():
    """check_requests against answers known right (the model's own greedy
    decode) and the same answers broken: a token or the logits."""
    cfg = M.CONFIGS["tiny"]
    m = M.Llama(cfg, M.seeded_weights(cfg, 3))
    prompt = list(range(5, 40))
    seq, logits = list(prompt), None
    for _ in range(4):
        logits = m.forward_full(seq)[-1]
        seq.append(int(torch.argmax(logits)))
    good = {"id": 1, "conv": 0, "turn": 0, "engine": 0, "prompt": prompt,
            "generated": seq[len(prompt):], "logits": logits.tolist()}

    class A:
        dtype, tol, tie, reply = "fp32", 1e-3, 1e-3, 4
    fails, ties, err = R.check_requests(m, [good], A)
    assert fails == [] and err < 1e-5
    bad_token = dict(good, generated=good["generated"][:2] +
                     [(good["generated"][2] + 1) % cfg.vocab] +
                     good["generated"][3:])
    fails, _, _ = R.check_requests(m, [bad_token], A)
    assert fails and "token 2 is" in fails[0]
    bad_logits = dict(good, logits=(logits * 1.01).tolist())
    fails, _, _ = R.check_requests(m, [bad_logits], A)
    assert len(fails) == 1 and "final logits" in fails[0]
    # An answer cut short is right as far as it goes: still a failure.
    short = dict(good, generated=good["generated"][:3],
                 logits=m.forward_full(seq[:-2])[-1].tolist())
    fails, _, _ = R.check_requests(m, [short], A)
    assert len(fails) == 1 and "3 tokens generated" in fails[0]
    fails, _, _ = R.check_requests(m, [dict(good, prompt_len=34)], A)
    assert len(fails) == 1 and "after a prompt of 34" in fails[0]


def children():
    """Live child processes of this one (pid -> command name), but
    multiprocessing's resource tracker."""
    me, out = os.getpid(), {}
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
        except (OSError, ValueError):
            continue
        if not pid.isdigit():
            continue
        comm = st[st.index("(") + 1:st.rindex(")")]
        state, ppid = st[st.rindex(")") + 2:].split()[:2]
        if int(ppid) != me or state == "Z":
            continue
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"resource_tracker" in f.read():
                continue    # multiprocessing's own, for the session
        out[int(pid)] = comm
    return out


def test_an_engine_that_dies_fails_the_run_cleanly(tmp_path):
    """Engines that die before they are ready (weights the model refuses):
    the run fails at once naming the engine, not after a long wait, and
    leaves no engine or daemon running."""
    cfg = M.CONFIGS["tiny"]
    w = M.seeded_weights(cfg, 1)
    del w["lm_head.weight"]
    path = tmp_path / "bad.safetensors"
    M.save_safetensors(str(path), w)
    a = R.parse_args(SMALL_RUN + ["--weights", str(path), "--engines",
                                  "1"])
    before = children()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"engine \d exited 1 before it "
                       "was ready"):
        R.run_mode(a, "shared", cfg, str(tmp_path))
    assert time.monotonic() - t0 < 60
    assert children() == before


def test_messages_read_while_waiting_are_kept():
    """While the driver waits for one engine (a restarted one's ready),
    what the others send is kept for the main loop, not dropped."""
    import collections
    import queue

    class Alive:
        def is_alive(self):
            return True

    q = queue.Queue()
    for m in [("first", 0, 7, 1.0), ("done", 0, 7, [1], [0.0], 0, 3, 2.0),
              ("ready", 1)]:
        q.put(m)
    pending = collections.deque()
    got = R.expect(q, {0: (Alive(), None), 1: (Alive(), None)}, pending,
                   "ready", [1], "it was ready")
    assert got == {1: ("ready", 1)}
    assert [m[0] for m in pending] == ["first", "done"]


def test_safetensors_refusals(tmp_path):
    cfg = M.CONFIGS["tiny"]
    w = M.seeded_weights(cfg, 1)
    p = tmp_path / "w.safetensors"
    M.save_safetensors(str(p), w)
    back = M.load_safetensors(str(p))
    assert all(torch.equal(w[n], back[n]) for n in w)
    del back["lm_head.weight"]
    with pytest.raises(ValueError, match="lack lm_head.weight"):
        M.Llama(cfg, back)
    p.write_bytes(b"\x10\x00")
    with pytest.raises(ValueError, match="too short"):
        M.load_safetensors(str(p))


@pytest.mark.parametrize("entry,data,msg", [
    # a byte range that does not match shape x dtype size
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}, 12,
     "12 bytes for shape"),
    ({"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 16]}, 16,
     "16 bytes for shape"),
    ({"dtype": "F32", "shape": [], "data_offsets": [0, 8]}, 8,
     "8 bytes for shape"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}, 8,
     "not a list of non-negative integers"),
    ({"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}, 8,
     "not a list of non-negative integers"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}, 8,
     "is not \\[begin, end\\]"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, 8,
     "out of the file"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, 8,
     "out of the file"),
    ({"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}, 8,
     "dtype I64 not supported"),
    ({"dtype": "F32", "shape": [2]}, 8, "not a tensor entry"),
])
def test_safetensors_malformed_headers(tmp_path, entry, data, msg):
    """A header whose entry does not describe its bytes is refused with a
    ValueError naming the file and the tensor, never read as something
    else."""
    h = json.dumps({"w": entry}).encode()
    p = tmp_path / "bad.safetensors"
    p.write_bytes(len(h).to_bytes(8, "little") + h + bytes(data))
    with pytest.raises(ValueError, match=msg) as ei:
        M.load_safetensors(str(p))
    assert "bad.safetensors: w:" in str(ei.value)


def test_safetensors_header_not_an_object(tmp_path):
    p = tmp_path / "bad.safetensors"
    for h in (b"[1, 2]", b"{nope"):
        p.write_bytes(len(h).to_bytes(8, "little") + h)
        with pytest.raises(ValueError, match="header is not"):
            M.load_safetensors(str(p))


def test_engine_refuses_a_pool_of_another_shape(daemon):
    cfg = M.CONFIGS["tiny"]   # 2 layers, 2 kv heads of 16; the pool's are 8
    m = M.Llama(cfg, M.seeded_weights(cfg, 1))
    with kvshare.Client(daemon.socket) as c:
        with pytest.raises(ValueError, match="not the model's"):
            Engine(c, m)


def test_the_model_is_transformers_llama():
    """Where transformers is installed: its LlamaForCausalLM with the same
    weights gives the same logits as model.py's from-scratch forward."""
    pytest.importorskip("transformers", reason="transformers is not "
                        "installed (pip install transformers)")
    cfg = M.CONFIGS["tiny"]
    w = M.seeded_weights(cfg, 5)
    hf = M.transformers_llama(cfg, w)
    seq = list(range(1, 150))
    with torch.no_grad():
        ours = M.Llama(cfg, w).forward_full(seq)
        theirs = hf(torch.tensor([seq])).logits[0]
    assert float((ours - theirs).abs().max()) < 1e-4 * float(
        theirs.abs().max())
