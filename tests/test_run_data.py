"""Training data: loss masks, EOS, packing, attention isolation, losses, split, schedule.

Runs on CPU with the shipped tiny Llama (`examples/tiny-llama`: config and char-level
tokenizer with a chat template) at random init; the whole file takes a few seconds.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from frugal.data.examples import (
    DataStats,
    Example,
    Row,
    Schedule,
    collate,
    detect_format,
    load_examples,
    pack,
    split,
    tokenize,
    unpacked,
)
from frugal.errors import FrugalError
from frugal.step.loss import IGNORE, causal_lm_loss

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny-llama"
DATA = ROOT / "examples" / "data"

TWO_TURNS = [
    {"role": "system", "content": "Answer in capitals."},
    {"role": "user", "content": "hello there"},
    {"role": "assistant", "content": "HELLO THERE"},
    {"role": "user", "content": "bye now"},
    {"role": "assistant", "content": "BYE NOW"},
]


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tok() -> Any:
    return AutoTokenizer.from_pretrained(str(TINY))


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def trained(ex: Example) -> list[int]:
    return [t for t in ex.labels if t != IGNORE]


def runs(labels: list[int]) -> int:
    """Number of contiguous runs of trained positions."""
    n, prev = 0, False
    for x in labels:
        cur = x != IGNORE
        n += cur and not prev
        prev = cur
    return n


def make_model(impl: str) -> Any:
    torch.manual_seed(0)
    cfg = AutoConfig.from_pretrained(str(TINY))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=impl)
    assert model.config._attn_implementation == impl
    return model.float().eval()


def forward(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Logits, feeding the model what the trainer feeds it (recipe._forward)."""
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "segment_ids")}
    with torch.no_grad():
        return model(**inputs, use_cache=False).logits


def alone(model: Any, ex: Example) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [T, V], labels [T]) of one example run on its own, no padding."""
    ids = torch.tensor([ex.input_ids])
    logits = forward(model, {"input_ids": ids})
    return logits[0], torch.tensor(ex.labels)


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request: pytest.FixtureRequest) -> Any:
    return make_model(request.param)


# -- 1, 2: loss masks and EOS ---------------------------------------------------------------


def test_text_rows_train_every_token_but_the_first(tok: Any) -> None:
    for row in read_jsonl(DATA / "spell.jsonl"):
        ex = tokenize(row, "text", tok, "spell")
        assert ex.input_ids[0] == tok.bos_token_id
        assert ex.input_ids[-1] == tok.eos_token_id
        assert ex.labels[0] == IGNORE
        assert ex.labels[1:] == ex.input_ids[1:]
        assert tok.decode(trained(ex)) == row["text"] + "</s>"


def test_prompt_completion_masks_exactly_the_prompt(tok: Any) -> None:
    for row in read_jsonl(DATA / "sums.jsonl"):
        ex = tokenize(row, "prompt_completion", tok, "sums")
        n_prompt = len(tok(row["prompt"])["input_ids"])
        assert ex.labels[:n_prompt] == [IGNORE] * n_prompt
        assert ex.labels[n_prompt:] == ex.input_ids[n_prompt:]
        assert IGNORE not in ex.labels[n_prompt:]
        assert ex.input_ids[-1] == tok.eos_token_id and ex.labels[0] == IGNORE
        assert tok.decode(trained(ex)) == row["completion"] + "</s>"
        assert tok.decode(ex.input_ids[:n_prompt], skip_special_tokens=True) == row["prompt"]


def test_prompt_completion_longer_pair(tok: Any) -> None:
    row = {"prompt": "Q: what is 12 + 30?\nA:", "completion": " 42, of course."}
    ex = tokenize(row, "prompt_completion", tok, "x")
    assert tok.decode(trained(ex)) == " 42, of course.</s>"
    assert runs(ex.labels) == 1 and ex.input_ids[-1] == tok.eos_token_id


def test_chat_trains_only_the_assistant_turns(tok: Any) -> None:
    ex = tokenize({"messages": TWO_TURNS}, "chat", tok, "chat")
    assert tok.decode(ex.input_ids) == tok.apply_chat_template(TWO_TURNS, tokenize=False)
    assert tok.decode(trained(ex)) == "HELLO THERE</s>BYE NOW</s>"
    assert runs(ex.labels) == 2  # two separate assistant spans
    assert ex.labels[0] == IGNORE and ex.input_ids[-1] == tok.eos_token_id
    untrained = tok.decode([t for t, y in zip(ex.input_ids, ex.labels, strict=True) if y == IGNORE])
    for m in TWO_TURNS:
        if m["role"] != "assistant":
            assert m["content"] in untrained
    assert "HELLO" not in untrained and "BYE" not in untrained
    # the role markers are rendered but never trained
    assert untrained.count("<|assistant|>") == 2


def test_chat_file_rows_train_their_assistant_content(tok: Any) -> None:
    for row in read_jsonl(DATA / "chat.jsonl"):
        ex = tokenize(row, "chat", tok, "chat")
        want = "".join(m["content"] + "</s>" for m in row["messages"] if m["role"] == "assistant")
        assert tok.decode(trained(ex)) == want


def test_chat_messages_as_json_string(tok: Any) -> None:
    a = tokenize({"messages": TWO_TURNS}, "chat", tok, "x")
    b = tokenize({"messages": json.dumps(TWO_TURNS)}, "chat", tok, "x")
    assert a == b


def test_load_examples_detects_formats_and_ends_with_eos(tok: Any) -> None:
    for name, fmt in (("spell", "text"), ("sums", "prompt_completion"), ("chat", "chat")):
        st = DataStats()
        exs = load_examples(str(DATA / f"{name}.jsonl"), tok, 512, stats=st)
        assert st.format == fmt and st.rows == len(exs) and st.over_length == 0
        assert all(e.labels[0] == IGNORE and e.input_ids[-1] == tok.eos_token_id for e in exs)
        assert st.trained_tokens == sum(len(trained(e)) for e in exs)
        assert st.tokens == sum(len(e.input_ids) for e in exs) == sum(st.lengths)


def test_over_length_rows_are_truncated(tok: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "x" * 30}, {"text": "short"}])
    st = DataStats()
    exs = load_examples(str(path), tok, 10, stats=st)
    assert st.over_length == 1 and st.rows == 2
    assert st.lengths == [32, 7] and st.tokens == 39  # BOS + text + EOS, before truncation
    assert [len(e.input_ids) for e in exs] == [10, 7]
    assert exs[0].input_ids == tok("x" * 30)["input_ids"][:10]
    assert st.trained_tokens == 9 + 6
    assert all(len(r.input_ids) == 10 for r in pack(exs, 10, tok.pad_token_id))


def test_rows_with_nothing_to_train_are_dropped(tok: Any, tmp_path: Path) -> None:
    # the completion is cut off by truncation: nothing left to train
    rows = [{"prompt": "p" * 20, "completion": "c"}, {"prompt": "1+1=", "completion": "2"}]
    st = DataStats()
    exs = load_examples(str(write_jsonl(tmp_path / "pc.jsonl", rows)), tok, 8, stats=st)
    assert st.empty == 1 and st.over_length == 1 and len(exs) == 1
    assert tok.decode(trained(exs[0])) == "2</s>"
    with pytest.raises(FrugalError, match="no row has tokens to train"):
        load_examples(str(write_jsonl(tmp_path / "e.jsonl", rows[:1])), tok, 8)


def test_duplicates_are_counted(tok: Any, tmp_path: Path) -> None:
    st = DataStats()
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}, {"text": "b"}, {"text": "a"}])
    assert len(load_examples(str(path), tok, 64, stats=st)) == 3
    assert st.duplicates == 1


# -- 3: packing --------------------------------------------------------------------------------


def some_examples(tok: Any) -> list[Example]:
    texts = ["ab", "hello world", "x" * 20, "packing test", "q", "the end of the data"]
    return [tokenize({"text": t}, "text", tok, "x") for t in texts]


def test_pack_layout(tok: Any) -> None:
    exs = some_examples(tok)
    seq, pad = 24, tok.pad_token_id
    rows = pack(exs, seq, pad)
    assert all(
        len(r.input_ids) == len(r.labels) == len(r.segments) == len(r.positions) == seq
        for r in rows
    )
    recovered: list[Example] = []
    for r in rows:
        n_real = sum(1 for s in r.segments if s > 0)
        # padding only at the end, segment 0, IGNORE labels, pad token
        assert all(s > 0 for s in r.segments[:n_real])
        assert r.segments[n_real:] == [0] * (seq - n_real)
        assert r.labels[n_real:] == [IGNORE] * (seq - n_real)
        assert r.input_ids[n_real:] == [pad] * (seq - n_real)
        assert r.positions[n_real:] == list(range(seq - n_real))
        # segments numbered 1, 2, ... in each row, positions restart at 0 per sample
        segs = sorted(set(r.segments[:n_real]))
        assert segs == list(range(1, len(segs) + 1))
        for s in segs:
            idx = [i for i, x in enumerate(r.segments) if x == s]
            assert idx == list(range(idx[0], idx[-1] + 1))  # contiguous: not split
            assert [r.positions[i] for i in idx] == list(range(len(idx)))
            recovered.append(Example([r.input_ids[i] for i in idx], [r.labels[i] for i in idx]))
    # every example once, in order, intact, none split across rows
    assert recovered == exs
    # greedy: the next row's first sample would not have fitted in the previous row
    for a, b in itertools.pairwise(rows):
        used = sum(1 for s in a.segments if s > 0)
        first = b.segments.count(1)
        assert used + first > seq


def test_pack_exact_fit_and_one_per_row(tok: Any) -> None:
    ex = [Example([5, 6, 7], [IGNORE, 6, 7]), Example([8, 9], [IGNORE, 9])]
    rows = pack(ex, 5, 0)
    assert len(rows) == 1 and rows[0].input_ids == [5, 6, 7, 8, 9]
    assert rows[0].segments == [1, 1, 1, 2, 2] and rows[0].positions == [0, 1, 2, 0, 1]
    rows = pack(ex, 4, 0)
    assert [r.input_ids for r in rows] == [[5, 6, 7, 0], [8, 9, 0, 0]]
    assert [r.segments for r in rows] == [[1, 1, 1, 0], [1, 1, 0, 0]]


def test_packed_labels_never_cross_a_boundary(tok: Any) -> None:
    rows = pack(some_examples(tok), 24, tok.pad_token_id)
    for r in rows:
        for t in range(len(r.labels) - 1):
            if r.labels[t + 1] != IGNORE:  # position t is trained to predict t + 1
                assert r.segments[t] == r.segments[t + 1] > 0
    b = collate(rows, tok.pad_token_id, packed=True)
    assert set(b) == {"input_ids", "labels", "segment_ids", "position_ids"}
    assert b["input_ids"].shape == (len(rows), 24)
    assert b["position_ids"].tolist() == [r.positions for r in rows]


# -- 4, 5: no attention leakage, exact packed loss --------------------------------------------


def test_packed_sample_sees_only_itself(tok: Any, model: Any) -> None:
    a = tokenize({"text": "some earlier sample text"}, "text", tok, "a")
    b = tokenize({"prompt": "2+2=", "completion": "4"}, "prompt_completion", tok, "b")
    seq = len(a.input_ids) + len(b.input_ids) + 5
    rows = pack([a, b], seq, tok.pad_token_id)
    assert len(rows) == 1
    batch = collate(rows, tok.pad_token_id, packed=True)
    assert "attention_mask" not in batch
    packed = forward(model, batch)[0]
    sb = slice(len(a.input_ids), len(a.input_ids) + len(b.input_ids))
    b_alone, _ = alone(model, b)
    a_alone, _ = alone(model, a)
    assert torch.allclose(packed[sb], b_alone, atol=1e-5)
    assert torch.allclose(packed[: len(a.input_ids)], a_alone, atol=1e-5)

    # controls, so the test can fail: (i) no position restart -> one causal sequence
    plain = dict(batch, position_ids=torch.arange(seq).unsqueeze(0))
    assert (forward(model, plain)[0][sb] - b_alone).abs().max() > 1e-3
    # (ii) restarted positions but a 2D attention mask: no block-diagonal mask is built,
    # B attends to A, and its logits change
    leaky = dict(batch, attention_mask=torch.ones(1, seq, dtype=torch.long))
    assert (forward(model, leaky)[0][sb] - b_alone).abs().max() > 1e-3


def test_packed_loss_is_sum_of_sample_losses(tok: Any, model: Any) -> None:
    exs = some_examples(tok) + [
        tokenize(r, "prompt_completion", tok, "s") for r in read_jsonl(DATA / "sums.jsonl")[:4]
    ]
    rows = pack(exs, 32, tok.pad_token_id)
    assert len(rows) < len(exs)  # really packed
    batch = collate(rows, tok.pad_token_id, packed=True)
    total, count = causal_lm_loss(forward(model, batch), batch["labels"])
    want_total, want_count = torch.tensor(0.0), 0
    for e in exs:
        logits, labels = alone(model, e)
        s, c = causal_lm_loss(logits[None], labels[None])
        want_total += s
        want_count += int(c)
    assert int(count) == want_count == sum(len(trained(e)) for e in exs)
    assert torch.allclose(total, want_total, rtol=1e-5, atol=1e-4)


# -- 6: unpacked collate --------------------------------------------------------------------


def test_unpacked_collate_right_pads(tok: Any, model: Any) -> None:
    exs = some_examples(tok)[:4]
    rows = unpacked(exs)
    batch = collate(rows, tok.pad_token_id, packed=False)
    assert set(batch) == {"input_ids", "labels", "segment_ids", "position_ids", "attention_mask"}
    width = max(len(e.input_ids) for e in exs)
    assert batch["input_ids"].shape == (4, width)
    for i, e in enumerate(exs):
        n = len(e.input_ids)
        assert batch["input_ids"][i].tolist() == e.input_ids + [tok.pad_token_id] * (width - n)
        assert batch["labels"][i].tolist() == e.labels + [IGNORE] * (width - n)
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (width - n)
        assert batch["position_ids"][i, :n].tolist() == list(range(n))
    total, count = causal_lm_loss(forward(model, batch), batch["labels"])
    sums = [causal_lm_loss(lg[None], lb[None]) for lg, lb in (alone(model, e) for e in exs)]
    assert int(count) == sum(int(c) for _, c in sums)
    assert torch.allclose(total, sum(s for s, _ in sums), rtol=1e-5, atol=1e-4)


# -- 7: split ---------------------------------------------------------------------------------


def numbered(n: int) -> list[Example]:
    return [Example([1, i + 3, 2], [IGNORE, i + 3, 2]) for i in range(n)]


def test_split_is_seeded_disjoint_and_complete() -> None:
    exs = numbered(40)
    train, val = split(exs, 0.2, seed=3)
    assert (train, val) == split(exs, 0.2, seed=3)
    assert len(val) == 8 and len(train) == 32
    ids = lambda xs: [id(x) for x in xs]  # noqa: E731
    assert not set(ids(train)) & set(ids(val))
    assert sorted(ids(train) + ids(val)) == sorted(ids(exs))
    # both keep the original order
    pos = {id(e): i for i, e in enumerate(exs)}
    assert [pos[id(e)] for e in train] == sorted(pos[id(e)] for e in train)
    assert [pos[id(e)] for e in val] == sorted(pos[id(e)] for e in val)
    assert split(exs, 0.2, seed=4)[1] != val


def test_split_ratio_zero_and_tiny() -> None:
    exs = numbered(10)
    assert split(exs, 0.0, seed=1) == (exs, [])
    assert split(numbered(1), 0.3, seed=1) == (numbered(1), [])
    assert len(split(exs, 0.01, seed=1)[1]) == 1  # at least one held out
    assert len(split(exs, 0.3, seed=1)[1]) == 3


# -- 8: schedule --------------------------------------------------------------------------------


def test_schedule_epochs_read_each_row_at_most_once() -> None:
    s = Schedule(n_rows=23, effective_batch=4, epochs=3, seed=7)
    assert s.steps_per_epoch == 5 and s.total_steps == 15
    orders = []
    for e in range(3):
        rows = [r for k in range(5) for r in s.rows_of_step(e * 5 + k)]
        assert all(len(s.rows_of_step(e * 5 + k)) == 4 for k in range(5))
        assert len(rows) == len(set(rows)) == 23 // 4 * 4
        assert set(rows) <= set(range(23))
        orders.append(rows)
    assert orders[0] != orders[1] != orders[2] != orders[0]


def test_schedule_is_a_function_of_seed_and_step() -> None:
    a = Schedule(n_rows=50, effective_batch=6, epochs=5, seed=11)
    b = Schedule(n_rows=50, effective_batch=6, epochs=5, seed=11)
    steps = range(a.total_steps)
    walked = {k: a.rows_of_step(k) for k in steps}
    assert walked == {k: b.rows_of_step(k) for k in steps}
    fresh = Schedule(n_rows=50, effective_batch=6, epochs=5, seed=11)
    assert fresh.rows_of_step(37) == walked[37]
    # asking out of order (back to an earlier epoch) gives the same rows again
    assert fresh.rows_of_step(3) == walked[3] and fresh.rows_of_step(37) == walked[37]
    other = Schedule(n_rows=50, effective_batch=6, epochs=5, seed=12)
    assert [other.rows_of_step(k) for k in steps] != list(walked.values())


@pytest.mark.parametrize("eff", [8, 5])
@pytest.mark.parametrize("micro", [1, 2, 3, 4, 8])
def test_micro_batches_split_the_step_between_ranks(eff: int, micro: int) -> None:
    s = Schedule(n_rows=41, effective_batch=eff, epochs=2, seed=0)
    for step in (0, 3, s.steps_per_epoch + 1):
        shares = []
        for rank in range(2):
            mbs = list(s.micro_batches(step, rank, 2, micro))
            assert mbs and all(1 <= len(m) <= micro for m in mbs)
            shares.append([r for m in mbs for r in m])
        assert not set(shares[0]) & set(shares[1])
        assert sorted(shares[0] + shares[1]) == sorted(s.rows_of_step(step))
        assert abs(len(shares[0]) - len(shares[1])) <= 1
    one = [r for m in s.micro_batches(2, 0, 1, micro) for r in m]
    assert one == s.rows_of_step(2)


def test_schedule_total_steps_and_too_few_rows() -> None:
    def steps(epochs: float) -> int:
        return Schedule(n_rows=20, effective_batch=4, epochs=epochs, seed=0).total_steps

    assert steps(1) == 5 and steps(2) == 10 and steps(1.4) == 7 and steps(0.6) == 3
    assert steps(0.01) == 1
    with pytest.raises(FrugalError, match=r"training\.effective_batch=8") as e:
        Schedule(n_rows=5, effective_batch=8, epochs=1, seed=0)
    assert "5 rows" in str(e.value)


# -- 9: format errors ---------------------------------------------------------------------------


def test_detect_format() -> None:
    assert detect_format({"messages": []}, "w") == "chat"
    assert detect_format({"prompt": "a", "completion": "b"}, "w") == "prompt_completion"
    assert detect_format({"completion": "b"}, "w") == "prompt_completion"
    assert detect_format({"text": "a", "id": 1}, "w") == "text"
    with pytest.raises(FrugalError) as e:
        detect_format({"question": "q", "answer": "a"}, "f.jsonl:3")
    msg = str(e.value)
    assert "f.jsonl:3" in msg and "answer, question" in msg and "data.format" in msg
    with pytest.raises(FrugalError, match="keys: none"):
        detect_format({}, "w")
    # a null text is a text row, an empty one (counted and dropped as such), not "no text"
    assert detect_format({"text": None}, "w") == "text"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"text": ["a", "b"]}\n', "f.jsonl:1: 'text' is a list, not a string"),
        ('{"text": 42}\n', "f.jsonl:1: 'text' is a number, not a string"),
        ('{"prompt": "a", "completion": {"x": 1}}\n', "'completion' is an object"),
        ('{"text": "fine"}\n{"text": "bad \\ud800 here"}\n',
         "f.jsonl:2: 'text' holds a lone surrogate (\\ud800 at character 4)"),
        ('{"messages": [{"role": "user", "content": ["x"]}]}\n',
         "f.jsonl:1: message 1: 'content' is a list"),
    ],
)  # fmt: skip
def test_a_row_that_is_not_text_is_one_line_naming_it(
    tok: Any, tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "f.jsonl"
    path.write_text(content)
    with pytest.raises(FrugalError) as e:
        load_examples(str(path), tok, 64)
    assert says in str(e.value).replace(str(tmp_path) + "/", "")


@pytest.mark.parametrize(
    ("content", "line", "says"),
    [
        ('text\nfine\n"a\nb\n"c\n', 3, "',' expected after '\"'"),  # three rows, not two
        ('text\nfine\n"never closed\nmore\n', 3, "a quoted cell is never closed"),
        ('text\n"one, two",three\n', 2, "2 cells where the header has 1"),
        ('text,label\nonly\n', 2, "1 cells where the header has 2"),
    ],
)  # fmt: skip
def test_a_csv_that_would_be_misread_is_refused(
    tok: Any, tmp_path: Path, content: str, line: int, says: str
) -> None:
    path = tmp_path / "f.csv"
    path.write_text(content)
    with pytest.raises(FrugalError) as e:
        load_examples(str(path), tok, 64)
    assert f"f.csv:{line}: " in str(e.value) and says in str(e.value)
    multi = tmp_path / "ok.csv"  # a quoted cell over several lines is CSV, and one row
    multi.write_text('text\n"one\ntwo"\nthree\n')
    assert len(load_examples(str(multi), tok, 64)) == 2


def test_what_excel_and_long_context_data_look_like_still_reads(tok: Any, tmp_path: Path) -> None:
    """A UTF-8 byte-order mark (Excel's "CSV UTF-8"), a cell past the csv module's 128 KiB
    default (a long-context row), and blank lines between rows; an error after a blank line
    names the row's own line."""
    from frugal.data.rows import read_rows

    bom = tmp_path / "excel.csv"
    bom.write_bytes("\ufefftext\nhello\n".encode())
    assert [r for _, r in read_rows(str(bom))] == [{"text": "hello"}]
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes('\ufeff{"text": "hi"}\n'.encode())
    assert [r for _, r in read_rows(str(jsonl))] == [{"text": "hi"}]
    long = tmp_path / "long.csv"
    long.write_text("text\n" + '"' + "word " * 40_000 + '"\n')
    assert len(next(iter(read_rows(str(long))))[1]["text"]) == 200_000
    gaps = tmp_path / "gaps.csv"
    gaps.write_text('text\n"a"\n\n"b" c\n')
    with pytest.raises(FrugalError, match=r"gaps\.csv:4: not CSV"):
        list(read_rows(str(gaps)))


def test_unknown_keys_in_a_file(tok: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"input": "a", "output": "b"}])
    with pytest.raises(FrugalError, match=r"q\.jsonl:1: .*keys: input, output.*data\.format"):
        load_examples(str(path), tok, 64)


@pytest.mark.parametrize(
    "messages",
    [
        "not json",
        {"role": "user", "content": "hi"},
        [{"role": "user"}],
        [{"content": "hi"}],
        ["hi"],
        '[{"role": "user"}]',
    ],
)
def test_malformed_messages(tok: Any, messages: Any) -> None:
    with pytest.raises(FrugalError, match=r"w: 'messages' must be a list of \{role, content\}"):
        tokenize({"messages": messages}, "chat", tok, "w")


def test_chat_needs_a_chat_template(tmp_path: Path) -> None:
    plain = AutoTokenizer.from_pretrained(str(TINY))
    plain.chat_template = None
    with pytest.raises(FrugalError, match="tokenizer="):
        tokenize({"messages": TWO_TURNS}, "chat", plain, "w")
    path = write_jsonl(tmp_path / "c.jsonl", [{"messages": TWO_TURNS}])
    with pytest.raises(FrugalError, match="chat template"):
        load_examples(str(path), plain, 256)


def test_mixed_formats_fail(tok: Any, tmp_path: Path) -> None:
    rows = [{"text": "plain"}, {"prompt": "1+1=", "completion": "2"}]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(FrugalError, match=r"m\.jsonl:2: .*one format per file"):
        load_examples(str(path), tok, 64)
    # an explicit format reads every row that way: the prompt/completion row has no text,
    # an empty row, dropped
    st = DataStats()
    exs = load_examples(str(path), tok, 64, fmt="text", stats=st)
    assert st.format == "text" and (st.rows, st.empty, len(exs)) == (2, 1, 1)


def test_unknown_format_name(tok: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a"}])
    with pytest.raises(FrugalError, match=r"data\.format 'json'"):
        load_examples(str(path), tok, 64, fmt="json")


# -- 10: CSV, Parquet, saved HF dataset -------------------------------------------------------


def test_csv_parquet_and_saved_dataset_match_jsonl(tok: Any, tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = read_jsonl(DATA / "sums.jsonl")[:12]
    want = load_examples(str(write_jsonl(tmp_path / "s.jsonl", rows)), tok, 64)
    assert len(want) == 12

    with (tmp_path / "s.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["prompt", "completion"])
        w.writeheader()
        w.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "s.parquet"))
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "hf"))

    for path in ("s.csv", "s.parquet", "hf"):
        st = DataStats()
        got = load_examples(str(tmp_path / path), tok, 64, stats=st)
        assert got == want, path
        assert st.format == "prompt_completion" and st.rows == 12


def test_csv_chat_rows_with_json_messages(tok: Any, tmp_path: Path) -> None:
    with (tmp_path / "c.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["messages"])
        w.writeheader()
        w.writerow({"messages": json.dumps(TWO_TURNS)})
    (ex,) = load_examples(str(tmp_path / "c.csv"), tok, 256)
    assert tok.decode(trained(ex)) == "HELLO THERE</s>BYE NOW</s>"


def test_row_dataclass_is_what_collate_reads() -> None:
    r = Row([7, 8], [IGNORE, 8], [1, 1], [0, 1])
    b = collate([r, Row([9], [IGNORE], [1], [0])], 0, packed=True)
    assert b["input_ids"].tolist() == [[7, 8], [9, 0]]
    assert b["labels"].tolist() == [[IGNORE, 8], [IGNORE, IGNORE]]
    assert b["segment_ids"].tolist() == [[1, 1], [1, 0]]
    assert b["position_ids"].tolist() == [[0, 1], [0, 0]]


@pytest.mark.parametrize("packed", [True, False])
def test_batcher_equals_collate(tok: Any, packed: bool) -> None:
    from frugal.data.examples import Batcher

    exs = load_examples(str(DATA / "spell.jsonl"), tok, 64)[:40]
    rows = pack(exs, 64, tok.pad_token_id) if packed else unpacked(exs)
    want = collate([rows[i] for i in (5, 1, 3)], tok.pad_token_id, packed)
    got = Batcher(rows, tok.pad_token_id, packed)([5, 1, 3])
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
