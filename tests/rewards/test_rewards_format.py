"""The format reward: credit only for the full, well-formed structure; hand-built positive and negative cases."""

import pytest

from conftest import make_rollout
from rewardlab.rewards import REWARDS, build_reward
from rewardlab.rewards.format import FormatReward



def _scores(reward, texts):
    outs = reward([make_rollout(t) for t in texts])
    assert all(o.error is None for o in outs)
    return [o.score for o in outs]


THINK_ANSWER_OK = [
    "<think>2 + 3 = 5</think><answer>5</answer>",
    "  <think>\nstep 1\nstep 2\n</think>\n\n<answer> 5 </answer>\n",  # whitespace around and between
    "<think>a < b and c > d</think><answer>x</answer>",  # angle brackets that are not tags
]
THINK_ANSWER_BAD = [
    "<answer>5</answer>",  # no think
    "<think>why</think>",  # no answer
    "<answer>5</answer><think>why</think>",  # wrong order
    "<think>a</think><think>b</think><answer>5</answer>",  # repeated think
    "<think>a</think><answer>5</answer><answer>6</answer>",  # repeated answer
    "<think><think>a</think></think><answer>5</answer>",  # nested think
    "<think>a <answer>4</answer></think><answer>5</answer>",  # an answer tag inside the think block
    "<think>a</think><answer>5</answer> extra",  # text after
    "Sure! <think>a</think><answer>5</answer>",  # text before
    "<think>a</think> so <answer>5</answer>",  # text between
    "<think>a<answer>5</answer>",  # think never closed
    "<think>a</think><answer>5",  # answer never closed
    "<think>a</think><answer>  </answer>",  # blank answer
    "<think></think><answer>5</answer>",  # blank think
    "<Think>a</Think><answer>5</answer>",  # tags are case-sensitive
    "",
]


def test_think_answer():
    reward = FormatReward(pattern="think_answer")
    assert _scores(reward, THINK_ANSWER_OK) == [1.0] * len(THINK_ANSWER_OK)
    assert _scores(reward, THINK_ANSWER_BAD) == [0.0] * len(THINK_ANSWER_BAD)


def test_think_answer_is_the_default_and_allow_empty():
    assert FormatReward().pattern == "think_answer"
    assert _scores(FormatReward(allow_empty=True), ["<think></think><answer> </answer>"]) == [1.0]


def test_custom_tag_names():
    reward = FormatReward(think_tag="reasoning", answer_tag="final")
    assert _scores(reward, ["<reasoning>r</reasoning><final>5</final>", "<think>r</think><answer>5</answer>"]) == [
        1.0, 0.0]


def test_answer_pattern():
    ok = ["<answer>5</answer>", "Reasoning first. <answer>x = 2</answer> Done."]
    bad = ["5", "<answer>5</answer><answer>6</answer>", "<answer><answer>5</answer></answer>",
           "</answer>5<answer>", "<answer>5", "<answer> \n</answer>"]
    reward = FormatReward(pattern="answer")
    assert _scores(reward, ok) == [1.0, 1.0]
    assert _scores(reward, bad) == [0.0] * len(bad)


def test_boxed_pattern():
    ok = [r"so x = \boxed{\frac{1}{2}}.", r"\boxed{\{1, 2\}}", r"\boxed{ {a}{b} }"]
    bad = [r"\boxed{1} or \boxed{2}",  # repeated
           r"\boxed{\boxed{1}}",  # nested
           r"\boxed{\frac{1}{2}",  # unbalanced: never closed
           r"\boxed{}",  # blank
           r"\boxed 5",  # no braces
           "no box at all"]
    reward = FormatReward(pattern="boxed")
    assert _scores(reward, ok) == [1.0] * len(ok)
    assert _scores(reward, bad) == [0.0] * len(bad)


def test_user_regex_must_match_the_whole_stripped_completion():
    reward = FormatReward(regex=r"Answer: \d+")
    assert _scores(reward, ["Answer: 42", "  Answer: 42\n", "Answer: 42!", "The Answer: 42"]) == [1.0, 1.0, 0.0, 0.0]
    multiline = FormatReward(regex=r"Step 1:.*\nAnswer: \w+")  # DOTALL: .* crosses lines
    assert _scores(multiline, ["Step 1: a\nb\nAnswer: c"]) == [1.0]


def test_registered_and_built_from_config():
    assert REWARDS["format"] is FormatReward
    built = build_reward([{"name": "format", "pattern": "boxed", "weight": 0.2}])
    ok, bad = built([make_rollout(r"\boxed{1}"), make_rollout("1")])
    assert ok.score == pytest.approx(0.2) and bad.score == 0.0  # 0.2 * 1, 0.2 * 0
    assert ok.components == {"format": 1.0}


@pytest.mark.parametrize("spec, message", [
    ({"pattern": "xml"}, "pattern: unknown format pattern 'xml'; valid: answer, boxed, think_answer; for your own "
     "regular expression give regex: instead of pattern:"),
    ({"pattern": "boxed", "regex": "x"}, "pattern, regex: give one of them, not both"),
    ({"regex": "(unclosed"}, "regex: does not compile"),
    # tag options a pattern does not have were swallowed by its **_ (answer, boxed) or ignored (regex)
    ({"pattern": "answer", "think_tag": "reason"},
     "pattern: unknown option 'think_tag' for format pattern 'answer'; valid: allow_empty, answer_tag"),
    ({"pattern": "boxed", "answer_tag": "final"},
     "pattern: unknown option 'answer_tag' for format pattern 'boxed'; valid: allow_empty"),
    ({"regex": "<a>.*</a>", "answer_tag": "a"}, "answer_tag: not used with regex"),
])
def test_bad_options(spec, message):
    with pytest.raises(ValueError, match=rf"rewards\[0\] \(format\): {message}"):
        build_reward([{"name": "format", **spec}])


# Invisible characters are not content (issue 31, item 2): zero width space, byte order mark, word joiner, other
# format (Cf) characters, variation selectors, Hangul fillers, and whitespace.
INVISIBLE = ["\u200b", "\ufeff", "\u2060", "\u200c\u200d", "\u00ad", "\u202e", "\U000e0041", "\ufe0f", "\u3164",
             "\u2800", "\u034f", " \u200b\t\u3000\u00a0"]


@pytest.mark.parametrize("blank", INVISIBLE)
def test_invisible_characters_are_not_content(blank):
    assert _scores(FormatReward(), ["<think>\u200b</think><answer>\ufeff</answer>",
                                    f"<think>{blank}</think><answer>5</answer>",
                                    f"<think>why</think><answer>{blank}</answer>"]) == [0.0, 0.0, 0.0]
    assert _scores(FormatReward(pattern="answer"), [f"x <answer>{blank}</answer>"]) == [0.0]
    assert _scores(FormatReward(pattern="boxed"), [f"\\boxed{{{blank}}}"]) == [0.0]
    # visible content next to invisible characters still counts; allow_empty still accepts blank contents
    assert _scores(FormatReward(), [f"<think>{blank}a</think><answer>5{blank}</answer>"]) == [1.0]
    assert _scores(FormatReward(allow_empty=True), [f"<think>{blank}</think><answer>{blank}</answer>"]) == [1.0]
