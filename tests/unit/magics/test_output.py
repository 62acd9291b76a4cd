from workbench.magics.output import LineMerger


def collect(ranks, hold=0.2):
    out = []
    return LineMerger(ranks, lambda stream, text: out.append((stream, text)), hold=hold), out


def test_identical_lines_once_and_different_lines_labelled():
    m, out = collect([0, 1])
    m.feed(0, "stdout", "hello\nrank 0\n", now=0.0)
    assert out == []  # waits for rank 1
    m.feed(1, "stdout", "hello\nrank 1\n", now=0.05)
    assert out == [("stdout", "[ranks 0-1] hello\n"), ("stdout", "[rank 0] rank 0\n"),
                   ("stdout", "[rank 1] rank 1\n")]


def test_line_waits_at_most_hold():
    m, out = collect([0, 1], hold=0.2)
    m.feed(0, "stdout", "early\n", now=0.0)
    m.poll(now=0.1)
    assert out == []
    m.poll(now=0.25)
    assert out == [("stdout", "[rank 0] early\n")]


def test_partial_lines_and_streams_kept_apart():
    m, out = collect([0, 1])
    m.feed(0, "stdout", "par", now=0)
    m.feed(0, "stdout", "tial\n", now=0)
    m.feed(1, "stderr", "warn\n", now=0)
    m.feed(1, "stdout", "partial\n", now=0)
    m.feed(0, "stdout", "no newline", now=0)
    m.close()
    assert [t for s, t in out if s == "stdout"] == ["[ranks 0-1] partial\n", "[rank 0] no newline\n"]
    assert [t for s, t in out if s == "stderr"] == ["[rank 1] warn\n"]


def test_single_rank_is_labelled_by_rank():
    m, out = collect([2])
    m.feed(2, "stdout", "x\n", now=0)
    assert out == [("stdout", "[rank 2] x\n")]
