"""rewardlab environments as TRL environment classes (`GRPOTrainer(environment_factory=...)`): the tools TRL
discovers on the class (its rule: public functions of the class but reset and get_reward), their JSON schemas as
transformers builds them for the chat template, and the environment behind each call."""

import inspect

import pytest

from rewardlab.integrations.trl import as_trl_environment

transformers_utils = pytest.importorskip("transformers.utils")


def trl_tools(cls):
    """The methods TRL 1.16 turns into tools: the class's public functions other than reset and get_reward."""
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def test_guess_number_gets_a_guess_tool_and_its_outcome_reward():
    cls = as_trl_environment("guess_number", n=8)
    assert trl_tools(cls) == ["guess"]
    row = {"prompt": "Guess my number from 1 to 8. Write <g>K</g>.\n", "answer": "6", "n": 8}
    env = cls()
    assert env.reset(**row) is None  # nothing appended to the prompt
    schema = transformers_utils.get_json_schema(env.guess)
    assert schema["function"]["name"] == "guess"
    assert schema["function"]["parameters"]["properties"]["n"]["type"] == "integer"
    assert schema["function"]["parameters"]["required"] == ["n"]
    # binary search on [1, 8] for 6: 4 -> higher ([5, 8]), 7 -> lower ([5, 6]), 6 -> found
    assert [env.guess(4), env.guess(7)] == ["<o>higher</o>", "<o>lower</o>"]
    assert env.get_reward() == 0.0
    assert env.guess(6) == "found"
    assert env.get_reward() == 1.0
    assert env.turn_rewards == [4 / 8, 2 / 4, 1 / 2]  # the share of the feasible interval each guess removed
    assert env.guess(1) == "found: the game is over"
    other = cls()
    other.reset(**row)  # instances share the environment, not the episode
    assert other.get_reward() == 0.0


def test_calculator_tools_run_in_the_environment_with_its_checks():
    cls = as_trl_environment("calculator", size=4, test_size=2)
    try:
        assert trl_tools(cls) == ["calc"]
        env = cls()
        env.reset(**cls.env.rows("train", 1)[0])
        schema = transformers_utils.get_json_schema(env.calc)
        assert schema == {"type": "function", "function": cls.env.tools[0]["function"] | {"return": {"type": "string"}}}
        assert env.calc("12*34") == "408"
        assert env.calc(expression=7) == "error: expression must be a string, got '7'"  # rewardlab's own text
        assert [c["status"] for c in env.tool_calls] == ["ok", "bad_arguments"]
    finally:
        cls.env.close()


def test_environments_trl_cannot_drive_and_bad_names_are_one_line():
    from rewardlab.envs import MultiTurnEnv

    class Chatty(MultiTurnEnv):
        def env_response(self, messages, state):
            return "ok", 0.0

        def is_done(self, messages, state):
            return True

    with pytest.raises(ValueError, match=r"^as_trl_environment: TRL's loop acts only through tools, and Chatty has "
                                         r"none it can call; supported: ToolEnv environments"):
        as_trl_environment(Chatty())
    with pytest.raises(ValueError, match="unknown environment 'nope'.*guess_number"):
        as_trl_environment("nope")
    with pytest.raises(ValueError, match=r"options \['n'\] are for an environment name, not an instance"):
        as_trl_environment(Chatty(), n=3)
