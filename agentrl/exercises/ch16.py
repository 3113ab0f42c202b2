"""Checks for chapter 16's exercises."""
import copy

import torch
import agentrl as arl


# ----------------------------------------------------------------------------- 16.4 (implement)

class solution_16_4(arl.Objective):
    """On-policy distillation by the exact per-position reverse KL: at every policy
    position, sum_v pi_theta(v|h) (log pi_theta(v|h) - log pi_T(v|h)) over the whole
    vocabulary, with gradients through the student's full distribution; the loss is its
    mean over the minibatch's policy tokens."""

    def __init__(self, teacher):
        self.teacher = teacher

    def prepare(self, model, batch, cfg):
        """The teacher's full next-token log-probs -> batch['teacher_dist'] [B, T-1, V];
        the student is kept for the loss (train_rl's `logp` has only the sampled
        tokens)."""
        theirs, mine = self.teacher.embed.num_embeddings, model.embed.num_embeddings
        if theirs != mine:
            raise ValueError(f"the teacher's vocabulary has {theirs} words, the "
                             f"student's {mine}: they must share one tokenizer")
        self.model = model
        with torch.no_grad():
            batch['teacher_dist'] = torch.log_softmax(
                self.teacher(batch['ids'])[:, :-1] / cfg.temperature, -1)

    def advantages(self, batch, episodes, cfg):
        """A 1 on every policy token, so that every row with one learns -> [B, T-1]."""
        return batch['action_mask'].clone()

    def loss(self, logp, batch, rows, advantages, cfg):
        """Mean exact KL(student || teacher) over the rows' policy positions."""
        logits = self.model(batch['ids'][rows])[:, :-1]
        mine = torch.log_softmax(logits / cfg.temperature, -1)
        kl = (mine.exp() * (mine - batch['teacher_dist'][rows])).sum(-1)
        loss = arl.masked_mean(kl, batch['action_mask'][rows])
        return loss, dict(teacher_kl=loss.item())


class wrong_16_4_sampled_token(solution_16_4):
    """The sampled-token estimate log pi_theta(a) - log pi_T(a) of the sampled tokens,
    differentiated directly (not the exact sum over the vocabulary)."""

    def loss(self, logp, batch, rows, advantages, cfg):
        theirs = batch['teacher_dist'][rows].gather(
            -1, batch['ids'][rows][:, 1:, None])[..., 0]
        loss = arl.masked_mean(logp - theirs, batch['action_mask'][rows])
        return loss, dict(teacher_kl=loss.item())


class wrong_16_4_forward(solution_16_4):
    """The forward KL, sum_v pi_T (log pi_T - log pi_theta)."""

    def loss(self, logp, batch, rows, advantages, cfg):
        logits = self.model(batch['ids'][rows])[:, :-1]
        mine = torch.log_softmax(logits / cfg.temperature, -1)
        theirs = batch['teacher_dist'][rows]
        kl = (theirs.exp() * (theirs - mine)).sum(-1)
        loss = arl.masked_mean(kl, batch['action_mask'][rows])
        return loss, dict(teacher_kl=loss.item())


class wrong_16_4_detached_weights(solution_16_4):
    """Weights the log ratio by the student's probabilities without their gradient:
    the right value, but the gradient sum_v pi(v) grad log pi(v) is exactly zero."""

    def loss(self, logp, batch, rows, advantages, cfg):
        logits = self.model(batch['ids'][rows])[:, :-1]
        mine = torch.log_softmax(logits / cfg.temperature, -1)
        kl = (mine.exp().detach() * (mine - batch['teacher_dist'][rows])).sum(-1)
        loss = arl.masked_mean(kl, batch['action_mask'][rows])
        return loss, dict(teacher_kl=loss.item())


def _toy_batch(vocab=9):
    g = torch.Generator().manual_seed(16)
    lengths = torch.tensor([7, 5, 6])
    ids = torch.randint(4, vocab, (3, 7), generator=g)
    ids[1, 5:] = 0                                          # padding
    ids[2, 6:] = 0
    mask = torch.zeros(3, 6, dtype=arl.DTYPE)
    mask[0, 2:6] = 1
    mask[1, 1:4] = 1
    mask[2, 3:5] = 1
    return dict(ids=ids, lengths=lengths, action_mask=mask,
                sample_logp=torch.full((3, 6), -1.0, dtype=arl.DTYPE) * mask,
                rewards=torch.tensor([1.0, 0.0, 1.0], dtype=arl.DTYPE))


def _tiny(vocab, seed):
    return arl.TinyAgent(vocab, d_model=8, n_layers=1, n_heads=4, d_ff=16, max_len=16,
                         seed=seed).eval()


def check_16_4(cls):
    vocab, cfg = 9, arl.RLConfig()
    student, teacher = _tiny(vocab, 1), _tiny(vocab, 2)
    batch = _toy_batch(vocab)
    objective = cls(teacher)
    objective.prepare(student, batch, cfg)
    advantages = objective.advantages(batch, None, cfg)
    learns = (advantages != 0).reshape(3, -1).any(-1)
    assert bool(learns.all()), (
        'every row with policy tokens must have a nonzero advantage somewhere, or '
        'rl_update runs it without gradients; rows that would not learn: '
        f'{(~learns).nonzero()[:, 0].tolist()}')
    params = list(student.parameters())
    for rows in (torch.arange(3), torch.tensor([2, 0])):
        logp, _ = arl.token_log_probs(student, batch['ids'][rows], batch['lengths'][rows],
                                      cfg.temperature)
        loss, _ = objective.loss(logp, batch, rows, advantages[rows], cfg)
        assert loss.requires_grad, 'the loss has no gradient with respect to the student'
        got = torch.autograd.grad(loss, params, allow_unused=True)
        mine = torch.log_softmax(student(batch['ids'][rows])[:, :-1], -1)
        with torch.no_grad():
            theirs = torch.log_softmax(teacher(batch['ids'][rows])[:, :-1], -1)
        kl = (mine.exp() * (mine - theirs)).sum(-1)
        reference = arl.masked_mean(kl, batch['action_mask'][rows])
        want = torch.autograd.grad(reference, params)
        gap = abs(loss.item() - reference.item())
        assert gap < 1e-10, (
            f'the loss must be the mean over the policy tokens of the exact KL(student || '
            f'teacher) of the next-token distributions ({reference.item():.6f} on rows '
            f'{rows.tolist()}); got {loss.item():.6f}')
        worst = max(((g if g is not None else torch.zeros_like(w)) - w).abs().max().item()
                    for g, w in zip(got, want))
        assert worst < 1e-10, (
            'the loss has the right value but the wrong gradient (largest gap '
            f'{worst:.2e}): the student\'s probabilities that weight the log ratio must '
            'keep their gradient')
    same = cls(copy.deepcopy(student))
    batch = _toy_batch(vocab)
    same.prepare(student, batch, cfg)
    rows = torch.arange(3)
    logp, _ = arl.token_log_probs(student, batch['ids'], batch['lengths'], cfg.temperature)
    loss, _ = same.loss(logp, batch, rows, same.advantages(batch, None, cfg), cfg)
    assert abs(loss.item()) < 1e-12, (
        f'a student identical to its teacher has KL 0; the loss was {loss.item():.3e}')


CHECKS = [
    dict(number='16.4', name='ExactReverseKL', solution=solution_16_4, check=check_16_4,
         wrong=[wrong_16_4_sampled_token, wrong_16_4_forward, wrong_16_4_detached_weights],
         summary='on-policy distillation with the exact per-position reverse KL as the loss'),
]
