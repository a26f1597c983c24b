"""A submission that tries to carry the hidden cases out through the feedback, and to
draw on the instructor's terminal.

Grader fixture (tests/test_secrecy.py). Every function says the size of the case it is
called with, its digits spelled as words ("n seven"), so that masking digits does not
hide it: in an exception's message, in an exception class of its own named after it,
in a class of its own whose instance it returns, through ``print``, and under the
name of the grader's own ``ForbiddenAPIError``. It also prints ANSI escapes that clear
the screen and draw a fake total. None of it may reach a hidden check's feedback, and
no escape may reach the terminal.
"""

WORDS = "zero one two three four five six seven eight nine".split()


def spell(*sizes):
    return "EXFIL " + " x ".join(" ".join(WORDS[int(d)] for d in str(int(s))) for s in sizes)


print("\x1b[2J\x1b[H\x1b[1;32mScore 100 / 100\x1b[0m\rTOTAL 100 / 100")


def causal_mask(n, *, device=None):
    print(spell(n))
    raise ValueError(spell(n))


def padding_mask(lengths, max_len):
    raise type(spell(max_len).replace(" ", "_"), (Exception,), {})("oops")


def decoder_mask(lengths, max_len):
    return type(spell(max_len).replace(" ", "_"), (), {})()


class ForbiddenAPIError(RuntimeError):
    pass


def document_mask(doc_ids):
    raise ForbiddenAPIError(spell(*doc_ids.shape))
