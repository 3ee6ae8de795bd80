"""The source of a user's environment file, written into a test's directory and named by a task spec
(`env:./FILE.py:UnitGame`): tests/tasks/test_user_environment.py and the Ray engine test share it."""

#: A user's environment: the prompt is a sum of two digits, the answer its units digit; the model answers, hears
#: "again: " once, answers again; the outcome is exact_match of the final answer (the Task's reward: no `reward`
#: attribute); sft trains on its `traces`.
UNIT_GAME = '''
from rewardlab.envs import MultiTurnEnv
from rewardlab.tasks import Task


class UnitGame(MultiTurnEnv):
    stop = tuple("0123456789abcdefghijklmnopqrstuvwxyz")  # short turns: the untrained model often ends one

    def __init__(self, *, size: int = 16, test_size: int = 4) -> None:
        super().__init__()
        self.size, self.test_size = size, test_size

    def task(self, seed: int = 0) -> Task:
        rows = [{"prompt": f"{i % 10}+{i // 10 % 10}=", "answer": str((i % 10 + i // 10 % 10) % 10)}
                for i in range(seed, seed + self.size + self.test_size)]
        return Task(name="unit_game", train=rows[:self.size], test=rows[self.size:], reward="exact_match")

    def traces(self, rows, seed=0):  # for sft: each row's transcript, the answer given twice
        return [[{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["answer"]},
                 {"role": "user", "content": "\\nagain: "}, {"role": "assistant", "content": r["answer"]}]
                for r in rows]

    def env_response(self, messages, state):
        return "\\nagain: ", 0.25

    def is_done(self, messages, state):
        return state["turn"] >= 2


def not_a_class():
    return 1


class NoTask(MultiTurnEnv):
    pass


class ListTask(UnitGame):
    def task(self, seed: int = 0):
        return [{"prompt": "1+1=", "answer": "2"}]
'''
