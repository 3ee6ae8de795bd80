"""rewardlab's preference losses against TRL's on identical log-probs (issue 36): TRL's DPOTrainer computes its loss
on a batch of a tiny model and a different reference model; the same batch's summed log-probs, computed here from the
same models, go through `preference_loss`. Reference-free losses against TRL's CPO (simpo) and ORPO loss functions.

Run with `-s` to print the largest difference of each."""

import tempfile
from types import SimpleNamespace

import pytest
import torch

from conftest import TINY_ARCH
from rewardlab.po.losses import preference_loss
from rewardlab.policy import load_policy

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")

PAIRS = [{"prompt": "3+4=", "chosen": "7", "rejected": "8 or 9"},
         {"prompt": "2+2=", "chosen": "4 ok", "rejected": "5"},
         {"prompt": "9-1=", "chosen": "8", "rejected": "10"}]


@pytest.fixture(scope="module")
def dpo_trainer():
    from trl import DPOConfig, DPOTrainer

    policy = load_policy("tiny", seed=0, tiny_arch=TINY_ARCH)
    reference = load_policy("tiny", seed=1, tiny_arch=TINY_ARCH)
    args = DPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(PAIRS), beta=0.5,
                     loss_type=["sigmoid"], report_to=[], use_cpu=True, max_steps=1)
    trainer = DPOTrainer(model=policy.model, ref_model=reference.model, args=args,
                         train_dataset=datasets.Dataset.from_list(PAIRS), processing_class=policy.tokenizer)
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer, batch, policy.model, reference.model


def _summed(model, batch):
    """Summed completion log-probs and completion lengths of each row of TRL's batch ([chosen; rejected])."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(2, batch["input_ids"][:, 1:, None]).squeeze(2)
    mask = batch["completion_mask"][:, 1:].float()
    return (logp * mask).sum(1), mask.sum(1)


def _trl_loss(trainer, batch, loss_types, weights, beta):
    trainer.loss_types, trainer.loss_weights, trainer.beta = loss_types, weights, beta
    with torch.no_grad():
        return float(trainer.compute_loss(trainer.model, batch))


@pytest.mark.parametrize("trl_types, weights, ours, options", [
    (["sigmoid"], [1.0], "dpo", {"beta": 0.5}),
    (["ipo"], [1.0], "ipo", {"beta": 0.3}),
    (["bco_pair"], [1.0], "bco_pair", {"beta": 0.5}),
    (["sigmoid", "bco_pair"], [0.8, 0.2], ["dpo", "bco_pair"], {"beta": 0.5, "loss_weights": [0.8, 0.2]}),
])
def test_reference_losses_match_trls_dpo_trainer(dpo_trainer, trl_types, weights, ours, options):
    trainer, batch, policy, reference = dpo_trainer
    logps, lengths = _summed(policy, batch)
    ref_logps, _ = _summed(reference, batch)
    (pc, pr), (rc, rr), (lc, lr) = logps.chunk(2), ref_logps.chunk(2), lengths.chunk(2)
    losses, _ = preference_loss(ours, chosen_logps=pc, rejected_logps=pr, ref_chosen_logps=rc, ref_rejected_logps=rr,
                                chosen_lengths=lc, rejected_lengths=lr, **options)
    theirs = _trl_loss(trainer, batch, trl_types, weights, options["beta"])
    print(f"\n{ours} vs TRL {trl_types}: |difference| = {abs(float(losses.mean()) - theirs):.2e}")
    assert float(losses.mean()) == pytest.approx(theirs, abs=1e-5)


def test_sft_differs_from_trls_token_mean_only_by_the_averaging(dpo_trainer):
    trainer, batch, policy, _ = dpo_trainer
    logps, lengths = _summed(policy, batch)
    (pc, pr), (lc, lr) = logps.chunk(2), lengths.chunk(2)
    theirs = _trl_loss(trainer, batch, ["sft"], [1.0], 0.5)
    token_mean = float(-pc.sum() / lc.sum())  # TRL: the mean over every chosen token of the batch
    assert token_mean == pytest.approx(theirs, abs=1e-5)
    ours, _ = preference_loss("sft", chosen_logps=pc, rejected_logps=pr, chosen_lengths=lc, rejected_lengths=lr)
    assert float(ours.mean()) == pytest.approx(float((-pc / lc).mean()), abs=1e-6)  # per-example mean here
    assert lc.unique().numel() > 1  # the two conventions differ on this batch: the test can tell them apart


def _fake_self(**fields):
    return SimpleNamespace(accelerator=SimpleNamespace(device=torch.device("cpu")), **fields)


def test_simpo_matches_trls_cpo_loss():
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    aw, al = torch.tensor([-0.5, -1.2, -0.3]), torch.tensor([-0.9, -1.0, -2.0])
    theirs, _, _ = CPOTrainer.cpo_loss(_fake_self(alpha=0.0, loss_type="simpo", simpo_gamma=0.7, beta=2.0,
                                                  label_smoothing=0.0), aw, al)
    lengths = torch.tensor([3, 5, 2])
    ours, _ = preference_loss("simpo", chosen_logps=aw * lengths, rejected_logps=al * lengths,
                              chosen_lengths=lengths, rejected_lengths=lengths, beta=2.0, gamma=0.7)
    print(f"\nsimpo vs TRL's CPO simpo: |difference| = {float((ours - theirs).abs().max()):.2e}")
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_orpos_odds_ratio_term_matches_trls():
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    aw, al = torch.tensor([-0.5, -1.2, -0.3]), torch.tensor([-0.9, -1.0, -2.0])
    ratio_losses, _, _, _, _ = ORPOTrainer.odds_ratio_loss(_fake_self(beta=0.2), aw, al)
    lengths = torch.tensor([4, 1, 6])
    ours, _ = preference_loss("orpo", chosen_logps=aw * lengths, rejected_logps=al * lengths,
                              chosen_lengths=lengths, rejected_lengths=lengths, beta=0.2)
    # TRL: loss = NLL - mean(beta * log sigmoid(log odds)); here per example: -a_w - beta * log sigmoid(log odds)
    diff = (ours - (-aw - ratio_losses)).abs().max()
    print(f"\norpo vs TRL's odds_ratio_loss: |difference| = {float(diff):.2e}")
    assert float(diff) < 1e-6


def test_the_reference_model_is_not_the_policy(dpo_trainer):
    _, batch, policy, reference = dpo_trainer
    assert not torch.allclose(_summed(policy, batch)[0], _summed(reference, batch)[0])  # log-ratios are not 0
