"""rewardlab environments as a verl agent loop (`rewardlab.integrations.verl_agent`), run against a fake verl server
client whose `generate(request_id, prompt_ids=, sampling_params=)` samples with the tiny model on CPU.

The loop is built the way verl's agent-loop worker builds it (hydra `instantiate` of its registry entry, with verl's
own arguments). Its episodes must be exactly the episodes rewardlab's own loop (`run_episodes`) runs with the same
sampler: the sampler here draws from a random stream keyed by the prompt ids it is given, so both paths draw the
same tokens exactly when they hand the model the same ids with the same budget and stop strings."""

import asyncio
import string

import pytest

pytest.importorskip("verl.experimental.agent_loop", reason="needs verl 0.9.1 (make test-verl builds .venv-verl)")

import hydra  # noqa: E402
from hydra.errors import InstantiationException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from rewardlab.envs import EpisodeSettings, GuessNumberEnv, make_env, run_episodes  # noqa: E402
from rewardlab.integrations import verl_agent  # noqa: E402
from rewardlab.policy import SamplingSettings, load_policy  # noqa: E402

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}


@pytest.fixture(scope="module")
def policy():
    return load_policy("tiny")


def stream(ids):
    """The sampler's random stream for a prompt: a function of its ids only."""
    return (len(ids), sum(ids) % 2**31)


class SameSampler:
    """rewardlab's TokenSampler over the tiny model, drawing from the stream of each prompt's ids (not the episode
    loop's streams), as the fake server does."""

    def __init__(self, policy):
        self.policy = policy
        self.tokenizer, self.prompt_format = policy.tokenizer, policy.prompt_format
        self.eos_token_id, self.context_window = policy.eos_token_id, None

    def sample_ids(self, prompts, *, max_new_tokens, temperature, top_p, greedy, stop, streams):
        return self.policy.sample_ids(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                      greedy=greedy, stop=stop, streams=[stream(p) for p in prompts])


class FakeServer:
    """verl's server client (`LLMServerClient.generate`), answered by the tiny model on CPU; records every call."""

    def __init__(self, policy):
        self.policy, self.calls = policy, []

    async def generate(self, request_id, *, prompt_ids, sampling_params, priority=0):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        (s,) = self.policy.sample_ids([prompt_ids], max_new_tokens=sampling_params["max_tokens"],
                                      temperature=sampling_params["temperature"], top_p=sampling_params["top_p"],
                                      greedy=False, stop=sampling_params.get("stop"), streams=[stream(prompt_ids)])
        return TokenOutput(token_ids=s.ids, log_probs=s.logprobs if sampling_params["logprobs"] else None,
                           stop_reason="completed")


class ScriptedServer:
    """A server that answers turn k with the k-th scripted (text, log-prob) pair."""

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns, self.calls = tokenizer, list(turns), []

    async def generate(self, request_id, *, prompt_ids, sampling_params, priority=0):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        text, logprob = self.turns[len(self.calls) - 1]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return TokenOutput(token_ids=ids, log_probs=[logprob] * len(ids), stop_reason="completed")


def build_loop(server, tokenizer, *, prompt_length=256, response_length=64, max_turns=3, tools=(), **options):
    """The loop as verl's AgentLoopWorker builds it: hydra instantiate of the registry entry (plus the options an
    agent-loop config entry would add), with verl's arguments."""
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": prompt_length, "response_length": response_length,
        "multi_turn": {"max_assistant_turns": max_turns, "max_tool_response_length": None}}}, "data": {}})
    return hydra.utils.instantiate(config={**_agent_loop_registry["rewardlab_env"], **options},
                                   trainer_config=DictConfigWrap(config), server_manager=server, tokenizer=tokenizer,
                                   processor=None, hf_model_type=None, dataset_cls=None,
                                   data_config=DictConfigWrap(config.data), tools=ToolListWrap(list(tools)))


def run(loop, row, **columns):
    return asyncio.run(loop.run(dict(PARAMS), raw_prompt=[{"role": "user", "content": row["prompt"]}],
                                extra_info=dict(row), **columns))


def test_registered_under_rewardlab_env():
    assert _agent_loop_registry["rewardlab_env"] == {
        "_target_": "rewardlab.integrations.verl_agent.RewardlabAgentLoop"}


class QuickTurns(GuessNumberEnv):
    """guess_number whose model turns also end at any letter, so that the random tiny model's episodes have several
    turns (answered with the "invalid" observation) within a few tokens."""

    stop = ("</g>", *string.ascii_letters)


def check_same_as_run_episodes(policy, loop, server, env, rows, response_length, max_turns):
    outs = [run(loop, row, index=i, data_source="rewardlab") for i, row in enumerate(rows)]
    # one row per call: the server samples one prompt at a time, and a batch of one gives the same floats
    episodes = EpisodeSettings(env, max_turns=max_turns, max_episode_tokens=response_length)
    sampling = SamplingSettings(max_new_tokens=response_length, temperature=1.0, top_p=1.0)
    ref = [r for row in rows for r in run_episodes(SameSampler(policy), episodes, [row], sampling, n=1)]
    assert len(ref) == len(rows)  # a raw renderer never splits an episode
    for out, r in zip(outs, ref):
        assert out.prompt_ids == r.prompt_ids
        assert out.response_ids == r.completion_ids
        assert out.response_mask == r.loss_mask
        assert out.response_logprobs == r.logprobs
        assert out.extra_fields["turn_scores"] == r.turn_rewards
        assert out.extra_fields["rewardlab_termination"] == r.termination
    # the server got logprobs=True whatever verl's calculate_log_probs, and each turn's own budget
    assert all(c[2]["logprobs"] is True and 1 <= c[2]["max_tokens"] <= response_length for c in server.calls)
    return outs


def test_guess_number_episodes_equal_rewardlabs_own(policy):
    server = FakeServer(policy)
    env = QuickTurns(n=4)
    loop = build_loop(server, policy.tokenizer, response_length=128, max_turns=3, env=env)
    outs = check_same_as_run_episodes(policy, loop, server, env, env.rows("train", 3), 128, 3)
    assert server.calls[0][2]["stop"] == list(QuickTurns.stop)
    assert any(0 in o.response_mask for o in outs)  # several turns: environment tokens inside a response
    assert len(server.calls) > 3


def test_calculator_episodes_equal_rewardlabs_own(policy):
    server = FakeServer(policy)
    loop = build_loop(server, policy.tokenizer, response_length=40, max_turns=2, env="calculator",
                      env_options={"size": 4, "test_size": 2})
    env = make_env("calculator", size=4, test_size=2)
    try:
        check_same_as_run_episodes(policy, loop, server, env, env.rows("train", 2), 40, 2)
    finally:
        env.close()
        loop._env_setup[0].close()


ROW = {"prompt": "Guess my number from 1 to 4. Write <g>K</g>.\n", "answer": "3", "n": 4}


def test_scripted_episode_by_hand(policy):
    tok = policy.tokenizer
    server = ScriptedServer(tok, [("<g>2</g>", -0.5), ("<g>3</g>", -0.25)])
    loop = build_loop(server, tok, response_length=40, max_turns=4, env="guess_number", env_options={"n": 4},
                      reward="guess_found")
    out = run(loop, ROW)
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    g2, obs, g3 = enc("<g>2</g>"), enc("<o>higher</o>"), enc("<g>3</g>")
    assert (len(g2), len(obs), len(g3)) == (8, 13, 8)  # one id per character
    assert out.prompt_ids == tok(ROW["prompt"])["input_ids"]  # BOS + the prompt, as rewardlab renders a raw row
    assert out.response_ids == g2 + obs + g3
    assert out.response_mask == [1] * 8 + [0] * 13 + [1] * 8
    assert out.response_logprobs == [-0.5] * 8 + [0.0] * 13 + [-0.25] * 8
    # the second turn continues the exact ids so far; its budget is what is left of response_length: 40 - 8 - 13
    assert server.calls[1][1] == out.prompt_ids + g2 + obs
    assert [c[2]["max_tokens"] for c in server.calls] == [40, 19]
    assert server.calls[0][0] == server.calls[1][0]  # one request id per episode (verl's sticky session)
    # [1, 4] -> guess 2, "higher" -> [3, 4]: (4 - 2) / 4; then 3 is found: (2 - 1) / 2
    assert out.extra_fields["turn_scores"] == [0.5, 0.5]
    assert out.extra_fields["rewardlab_termination"] == "env_done"
    assert out.num_turns == 4  # the prompt, two guesses, one observation
    assert out.reward_score == 1.0
    assert out.extra_fields["reward_extra_info"] == {"guess_found": 1.0, "error": 0.0}
    assert out.as_dict()["rollout_log_probs"].tolist() == pytest.approx(out.response_logprobs)


def test_episode_that_would_split_into_rows_is_refused(policy, monkeypatch):
    tok = policy.tokenizer
    server = ScriptedServer(tok, [("<g>2</g>", -0.5), ("<g>3</g>", -0.25)])
    loop = build_loop(server, tok, response_length=40, max_turns=4, env="guess_number", env_options={"n": 4})
    renderer = loop._env_setup[1]
    monkeypatch.setattr(renderer, "extend", lambda row_ids, history, new: None)  # a template rewriting history
    with pytest.raises(ValueError, match=r"^rewardlab_env: the chat template rewrites earlier turns, so this episode "
                                         r"would go on in a new row; verl takes one sequence per sample"):
        run(loop, ROW)
    assert len(server.calls) == 1


def test_bad_setups_are_one_line(policy):
    tok = policy.tokenizer
    server = ScriptedServer(tok, [])
    # verl builds the loop through hydra, which wraps the loop's one line in its InstantiationException
    with pytest.raises(InstantiationException, match=r"rewardlab_env.env: unknown environment 'nope'; valid: "
                                                     r"calculator, guess_number, python"):
        build_loop(server, tok, env="nope")
    with pytest.raises(InstantiationException, match=r"rewardlab_env: verl's tools \(search\) cannot be added"):
        build_loop(server, tok, env="guess_number", tools=[type("T", (), {"name": "search"})()])
    with pytest.raises(ValueError, match=r"^rewardlab_env: no environment: set the loop's env option or the "
                                         r"sample's extra_info\['env'\]"):
        run(build_loop(server, tok), ROW)
    with pytest.raises(ValueError, match=r"^rewardlab_env: the episode's first prompt has 46 tokens, over "
                                         r"rollout.prompt_length 10"):
        run(build_loop(server, tok, prompt_length=10, env="guess_number"), ROW)
    with pytest.raises(InstantiationException, match=r"rewardlab_env.reward: .*unknown reward 'nope'"):
        build_loop(server, tok, env="guess_number", reward="nope")


def test_sample_names_its_environment(policy):
    tok = policy.tokenizer
    server = ScriptedServer(tok, [("<g>3</g>", -1.0)])
    loop = build_loop(server, tok, response_length=40)
    out = asyncio.run(loop.run(dict(PARAMS), raw_prompt=[{"role": "user", "content": ROW["prompt"]}],
                               extra_info={"env": "guess_number", "env_options": {"n": 4}, "prompt": ROW["prompt"],
                                           "n": 4}, reward_model={"ground_truth": "3"}))
    assert out.extra_fields["rewardlab_termination"] == "env_done"  # the secret came from reward_model
    assert out.response_mask == [1] * 8


def test_verl_imports_the_loop_from_its_external_modules_variable():
    """VERL_USE_EXTERNAL_MODULES=rewardlab.integrations.verl_agent: importing verl registers the loop (how verl's
    agent-loop workers get it without a config file)."""
    from conftest import child_last_line

    code = ("import verl\nfrom verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
            "print(_agent_loop_registry['rewardlab_env']['_target_'])")
    modules = "rewardlab.integrations.verl,rewardlab.integrations.verl_agent"
    assert child_last_line(code, VERL_USE_EXTERNAL_MODULES=modules) == \
        "rewardlab.integrations.verl_agent.RewardlabAgentLoop"


def test_agent_loop_config_file_sets_the_options(policy, tmp_path):
    """An entry of `rollout.agent.agent_loop_config_path`, loaded as verl's worker loads it (OmegaConf, one registry
    entry per item, the whole entry, `name` included, given to hydra): its options reach the loop."""
    path = tmp_path / "agent_loops.yaml"
    path.write_text("- name: guess4\n  _target_: rewardlab.integrations.verl_agent.RewardlabAgentLoop\n"
                    "  env: guess_number\n  env_options: {n: 4}\n  max_turns: 4\n  max_new_tokens: 12\n"
                    "  reward: guess_found\n")
    (entry,) = OmegaConf.load(path)
    tok = policy.tokenizer
    server = ScriptedServer(tok, [("<g>2</g>", -0.5), ("<g>3</g>", -0.25)])
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 256, "response_length": 40, "multi_turn": {"max_assistant_turns": None}}}, "data": {}})
    loop = hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config), server_manager=server,
                                   tokenizer=tok, processor=None, hf_model_type=None, dataset_cls=None,
                                   data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
    assert loop.name == "guess4" and loop.limits.max_turns == 4 and loop.env_options == {"n": 4}
    out = run(loop, ROW)
    assert [c[2]["max_tokens"] for c in server.calls] == [12, 12]  # the per-turn cap, under 40 - 8 - 13 left
    assert out.reward_score == 1.0
