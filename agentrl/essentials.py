# Generated from book/02-rl-essentials.md by tools/tangle.py. Do not edit: edit the chapter and re-run the tangler.


__all__ = [
    'discounted_returns',
    'BernoulliBandit',
    'run_epsilon_greedy',
    'run_softmax_bandit',
    'PeekOrGuessEnv',
    'play_tabular_episode',
]


import torch


def discounted_returns(rewards, gamma):
    """Returns-to-go G_t = r_t + gamma * G_{t+1} of one episode: rewards [T] -> [T]."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.dim() != 1:
        raise ValueError("rewards must be one episode, a 1-D sequence; "
                         f"got shape {tuple(r.shape)}")
    returns = torch.zeros_like(r)
    running = torch.zeros((), dtype=torch.float64)
    for t in range(len(r) - 1, -1, -1):
        running = r[t] + gamma * running
        returns[t] = running
    return returns


class BernoulliBandit:
    """Multi-armed bandit: arm a pays 1.0 with probability probs[a], else 0.0."""

    def __init__(self, probs):
        p = torch.as_tensor(probs, dtype=torch.float64)
        if p.dim() != 1 or len(p) < 2:
            raise ValueError("probs must be a 1-D sequence of at least 2 arms, "
                             f"got shape {tuple(p.shape)}")
        if bool(((p < 0) | (p > 1)).any()):
            raise ValueError(f"probs must lie in [0, 1], got {p.tolist()}")
        self.probs = p
        self.k = len(p)

    def pull(self, arms, generator=None):
        """One reward per run: arms long [N] -> rewards float64 [N] of 0.0 and 1.0."""
        arms = torch.as_tensor(arms, dtype=torch.long)
        if bool(((arms < 0) | (arms >= self.k)).any()):
            raise ValueError(f"arms must lie in [0, {self.k - 1}], got {arms.tolist()}")
        u = torch.rand(arms.shape, generator=generator, dtype=torch.float64)
        return (u < self.probs[arms]).to(torch.float64)


def run_epsilon_greedy(bandit, steps, epsilon, n_runs, generator=None):
    """Epsilon-greedy on sample means, n_runs independent runs -> (rewards, arms).

    rewards and arms have shape [n_runs, steps].
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
    if steps < 1 or n_runs < 1:
        raise ValueError("steps and n_runs must be >= 1, "
                         f"got steps={steps!r}, n_runs={n_runs!r}")
    counts = torch.zeros(n_runs, bandit.k, dtype=torch.float64)
    means = torch.zeros(n_runs, bandit.k, dtype=torch.float64)
    rewards = torch.zeros(n_runs, steps, dtype=torch.float64)
    arms = torch.zeros(n_runs, steps, dtype=torch.long)
    rows = torch.arange(n_runs)
    for t in range(steps):
        best = (means == means.max(dim=1, keepdim=True).values).to(torch.float64)
        greedy = torch.multinomial(best, 1, generator=generator)[:, 0]  # ties: random
        random_arm = torch.randint(bandit.k, (n_runs,), generator=generator)
        explore = torch.rand(n_runs, generator=generator, dtype=torch.float64) < epsilon
        arm = torch.where(explore, random_arm, greedy)
        r = bandit.pull(arm, generator)
        counts[rows, arm] += 1
        means[rows, arm] += (r - means[rows, arm]) / counts[rows, arm]
        rewards[:, t], arms[:, t] = r, arm
    return rewards, arms


def run_softmax_bandit(bandit, steps, lr, n_runs, generator=None, baseline=True):
    """Softmax policy trained by the sampled policy gradient -> (rewards, arms).

    rewards and arms have shape [n_runs, steps].
    """
    if lr <= 0:
        raise ValueError(f"lr must be positive, got {lr!r}")
    if steps < 1 or n_runs < 1:
        raise ValueError("steps and n_runs must be >= 1, "
                         f"got steps={steps!r}, n_runs={n_runs!r}")
    prefs = torch.zeros(n_runs, bandit.k, dtype=torch.float64)
    avg = torch.zeros(n_runs, dtype=torch.float64)    # running mean reward: baseline
    rewards = torch.zeros(n_runs, steps, dtype=torch.float64)
    arms = torch.zeros(n_runs, steps, dtype=torch.long)
    for t in range(steps):
        pi = torch.softmax(prefs, dim=1)
        arm = torch.multinomial(pi, 1, generator=generator).squeeze(1)
        r = bandit.pull(arm, generator)
        one_hot = torch.nn.functional.one_hot(arm, bandit.k).to(torch.float64)
        score = one_hot - pi                                  # grad log pi(arm)
        b = avg if baseline else torch.zeros_like(avg)
        prefs += lr * (r - b)[:, None] * score
        avg += (r - avg) / (t + 1)
        rewards[:, t], arms[:, t] = r, arm
    return rewards, arms


class PeekOrGuessEnv:
    """Toy episodic task: a bug hides in one of n_spots spots.

    Action 0 peeks (reveals the spot); action 1 + i fixes spot i and ends the episode.
    """

    def __init__(self, n_spots=4, max_turns=3):
        if n_spots < 2 or max_turns < 1:
            raise ValueError("need n_spots >= 2 and max_turns >= 1, "
                             f"got n_spots={n_spots!r}, max_turns={max_turns!r}")
        self.n_spots, self.max_turns = n_spots, max_turns
        self.n_states = self.n_actions = 1 + n_spots   # 0 unknown, 1 + i knows spot i

    def reset(self, generator=None):
        """Hide the bug at a random spot -> state 0."""
        self.spot = int(torch.randint(self.n_spots, (), generator=generator))
        self.state, self.turn, self.done = 0, 0, False
        return self.state

    def step(self, action):
        """One action -> (state, reward, done)."""
        if self.done:
            raise ValueError("episode is over; call reset()")
        if not 0 <= action < self.n_actions:
            raise ValueError(f"action must be in [0, {self.n_actions - 1}], "
                             f"got {action!r}")
        self.turn += 1
        reward = 0.0
        if action == 0:
            self.state = 1 + self.spot
        else:
            reward, self.done = float(action - 1 == self.spot), True
        if self.turn >= self.max_turns:
            self.done = True
        return self.state, reward, self.done


def play_tabular_episode(env, logits, generator=None):
    """One episode of the softmax policy logits [n_states, n_actions].

    Returns (states, actions, rewards, log_probs [T]).
    """
    if logits.shape != (env.n_states, env.n_actions):
        raise ValueError(f"logits must have shape {(env.n_states, env.n_actions)}, "
                         f"got {tuple(logits.shape)}")
    state, done = env.reset(generator), False
    states, actions, rewards, log_probs = [], [], [], []
    while not done:
        log_pi = torch.log_softmax(logits[state], dim=0)
        action = int(torch.multinomial(log_pi.exp(), 1, generator=generator))
        states.append(state)
        actions.append(action)
        log_probs.append(log_pi[action])
        state, reward, done = env.step(action)
        rewards.append(reward)
    return states, actions, rewards, torch.stack(log_probs)
