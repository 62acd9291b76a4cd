"""Lines that differ only in numbers, collapsed with the spread (issue 25): pure functions and the merger."""

from __future__ import annotations

import pytest

from workbench.lines import shape, spread, wanted
from workbench.magics.output import LineMerger

pytestmark = pytest.mark.timeout(30)


def test_64_ranks_of_one_loss_line_become_one_line_with_the_range():
    lines = [f"step 40 loss {2.29 + 0.001 * r:.3f}" for r in range(64)]
    assert spread(lines) == "step 40 loss 2.290..2.353"


def test_numbers_that_agree_stay_as_written_and_each_column_has_its_own_range():
    lines = ["epoch 3 step 10/100 loss 0.5 lr 1e-03", "epoch 3 step 10/100 loss 0.7 lr 1e-03",
             "epoch 3 step 10/100 loss 0.25 lr 1e-03"]
    assert spread(lines) == "epoch 3 step 10/100 loss 0.25..0.7 lr 1e-03"


def test_range_is_numeric_not_alphabetical_and_keeps_signs_and_exponents():
    assert spread(["x 10", "x 9", "x -2"]) == "x -2..10"
    assert spread(["g 1e-05", "g 3e-06", "g 2.5E-4"]) == "g 3e-06..2.5E-4"


@pytest.mark.parametrize("lines", [
    ["loss 2.31", "acc 0.9"],                # other words
    ["loss 2.31", "loss 2.31 extra"],        # other text around the numbers
    ["loss 2.31", "loss 2.31 3"],            # another count of numbers
    ["done", "done"],                        # no number: identical lines are the merger's own case
    ["only one 1"],                          # one rank
])
def test_lines_of_other_shapes_are_not_collapsed(lines):
    assert spread(lines) is None


def test_digits_inside_words_are_text_not_numbers():
    assert shape("epoch2 v3 gpt2 7") == ("epoch2 v3 gpt2 \x00", ["7"])
    assert spread(["model gpt2 ok", "model gpt3 ok"]) is None


def test_default_on_above_8_ranks_and_the_option_wins():
    assert [wanted(None, n) for n in (2, 8, 9, 64)] == [False, False, True, True]
    assert wanted(False, 64) is False and wanted(True, 2) is True


def _merged(ranks, texts, spread_numbers):
    out = []
    m = LineMerger(ranks, lambda stream, text: out.append(text), hold=10, spread_numbers=spread_numbers)
    for r, text in zip(ranks, texts, strict=True):
        m.feed(r, "stdout", text, now=0)
    m.close()
    return out


def test_merger_collapses_numeric_lines_only_when_asked():
    ranks = list(range(16))
    texts = [f"step 40 loss {2.3 + r / 100:.2f}\nrank {r} says {'hi' if r else 'bye'}\nsame\n" for r in ranks]
    out = _merged(ranks, texts, spread_numbers=True)
    assert out[0] == "[ranks 0-15] step 40 loss 2.30..2.45\n"
    assert out[1:17] == [f"[rank {r}] rank {r} says {'hi' if r else 'bye'}\n" for r in ranks]  # text differs
    assert out[17:] == ["[ranks 0-15] same\n"]
    plain = _merged(ranks, texts, spread_numbers=False)
    assert len(plain) == 16 + 16 + 1 and plain[0] == "[rank 0] step 40 loss 2.30\n"


def test_per_rank_view_at_64_ranks_puts_the_failing_rank_first_and_counts_the_rest():
    from types import SimpleNamespace as R

    from workbench.magics.rank_tabs import rank_tabs

    ranks = [R(rank=R(rank=i), outcome="error" if i == 17 else "ok", stdout=f"{i}\n", stderr="",
               error=R(traceback="ValueError: bad") if i == 17 else None) for i in range(64)]
    bundle = rank_tabs(R(ranks=ranks), world_size=64)
    assert bundle["text/plain"] == "per rank (world size 64): 64 ranks · 63 ok · 1 error (rank 17)"
    page = bundle["text/html"]
    first_label = page.index("<label")
    assert page[first_label:].startswith('<label class="wb-fail"') and "rank 17 ✗" in page
    assert page.index("rank 17 ✗") < page.index(">rank 0<")  # the failing tab before rank 0's
    assert 'checked><label class="wb-fail"' in page  # and selected


def test_a_lost_ranks_tab_says_how_it_went_and_when_not_no_output():
    """Issue 24 item 9: an elastic run's lost rank had a tab saying "(no output)"."""
    from types import SimpleNamespace as R

    from workbench.magics.rank_tabs import rank_tabs

    ok = R(rank=R(rank=0), outcome="ok", stdout="", stderr="", error=None)
    gone = R(rank=R(rank=1), outcome="lost", stdout="", stderr="", error=None,
             lost="rank 1 died after step 100 (12:03:04)")
    page = rank_tabs(R(ranks=[ok, gone]), world_size=2)["text/html"]
    assert "rank 1 died after step 100 (12:03:04); the run went on without it" in page
    assert page.count("(no output)") == 1  # rank 0's, which printed nothing
