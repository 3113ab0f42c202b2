"""Schematic figures for the book: diagrams of boxes and arrows, drawn from code.

Each public function draws one schematic on `ax` (a new figure of FIGSIZE[name] inches
when ax is None) and returns the axes. The axes' data units are inches of that size, so
the layout holds on axes that fill a figure of that size. Nothing is random.
"""
import matplotlib
from matplotlib.patches import FancyBboxPatch

BLUE, ORANGE, _, _, PURPLE, _, _, GREY, OLIVE, _ = matplotlib.colormaps['tab10'].colors
FONT, SMALL = 8.5, 8            # points: text in boxes; labels on arrows and cells
FIGSIZE = dict(grpo_step=(9, 4.6), token_layout=(9, 3.3), three_policies=(9, 5.45),
               kl_estimators=(9, 3.85), turn_credit=(9, 5.7), sweep_layout=(9, 5.3))


def _canvas(ax, name):
    """ax with limits of FIGSIZE[name] in inches, no frame (None: a new figure)."""
    width, height = FIGSIZE[name]
    if ax is None:
        import matplotlib.pyplot as plt
        ax = plt.figure(figsize=(width, height)).add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis('off')
    return ax


def _tint(color, share=0.22):
    """color mixed with white: `share` of the color, the rest white."""
    return tuple(1 - share * (1 - c) for c in color[:3])


def _box(ax, xy, w, h, text, color, fontsize=FONT, fill=None, **text_kw):
    """A rounded box, lower left corner xy, w x h, with text (centred unless text_kw
    has at=(x, y)) -> the Text."""
    x, y = xy
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle='round,pad=0,rounding_size=0.06',
                                facecolor=_tint(color) if fill is None else fill,
                                edgecolor=color, linewidth=1.2))
    style = dict(ha='center', va='center', fontsize=fontsize) | text_kw
    return ax.text(*style.pop('at', (x + w / 2, y + h / 2)), text, **style)


def _frame(ax, xy, w, h, color=BLUE):
    """A dashed rounded frame around a group of boxes."""
    ax.add_patch(FancyBboxPatch(xy, w, h, fill=False, edgecolor=color, linewidth=1.0,
                                linestyle='--',
                                boxstyle='round,pad=0,rounding_size=0.08'))


def _arrow(ax, start, end, text=None, at=None, rad=0.0, color='0.3', style='-|>',
           **text_kw):
    """An arrow from start to end; text, if any, at `at` (default: centred just above
    the middle)."""
    ax.annotate('', xy=end, xytext=start,
                arrowprops=dict(arrowstyle=style, color=color, lw=1.2, shrinkA=0,
                                shrinkB=0, mutation_scale=11,
                                connectionstyle=f'arc3,rad={rad}'))
    if text:
        if at is None:
            at = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.05)
            text_kw = dict(ha='center', va='bottom') | text_kw
        ax.text(*at, text, fontsize=SMALL, **text_kw)


def grpo_step(ax=None):
    """One step of train_rl: sample groups, rewards, group advantages, rl_update."""
    ax = _canvas(ax, 'grpo_step')
    top, h = 3.0, 1.45
    _box(ax, (0.1, top), 1.8, h, 'current policy $\\pi_\\theta$\n'
         '(TinyAgent); for this\nbatch its weights\nare $\\pi_{\\mathrm{old}}$', BLUE)
    _box(ax, (2.4, top), 2.75, h, 'sample_groups (rollout_batch):\n'
         'K = group_size attempts at\neach of prompts_per_step tasks;\n'
         'sample_logp: the log-prob of\nevery token it samples', BLUE)
    _box(ax, (6.05, top), 2.85, h, 'environment (make_env)\n'
         'answers every call; when the\nepisode ends, reward $r_i$ = 1 if\n'
         'the submitted code passes\nthe hidden tests, else 0', GREY)
    _arrow(ax, (1.9, top + h / 2), (2.4, top + h / 2))
    _arrow(ax, (5.15, 3.95), (6.05, 3.95), 'calls')
    _arrow(ax, (6.05, 3.5), (5.15, 3.5), 'observations', at=(5.6, 3.44), ha='center',
           va='top')
    _arrow(ax, (8.1, top), (8.1, 1.85), 'one Trajectory\nper episode', at=(8.0, 2.42),
           ha='right', va='center')
    _box(ax, (7.15, 0.55), 1.75, 1.3, 'collate → batch\nids, action_mask,\n'
         'sample_logp\n($\\log\\pi_{\\mathrm{old}}$), rewards', GREY)
    _box(ax, (5.0, 0.55), 1.9, 1.3, 'compute_advantages\n'
         r'$\hat A_i = (r_i - \mathrm{mean})\,/\,\mathrm{std}$' '\n'
         'over the K attempts\nat the same task', ORANGE)
    _arrow(ax, (7.15, 1.2), (6.9, 1.2))
    _arrow(ax, (5.0, 1.2), (4.75, 1.2))
    _frame(ax, (0.1, 0.1), 4.65, 2.15)
    ax.text(0.22, 2.12, 'rl_update: epochs × minibatches steps on this batch',
            fontsize=SMALL, va='top', color=BLUE)
    _box(ax, (0.2, 0.55), 2.8, 1.3, 'policy_loss on a minibatch\n'
         r'$\rho_t = \pi_\theta(y_t)\,/\,\pi_{\mathrm{old}}(y_t)$ per token' '\n'
         r'$\min(\rho_t \hat A_i,\ \mathrm{clip}(\rho_t, 1-\epsilon, 1+\epsilon)'
         r'\,\hat A_i)$' '\ntoken_mean over action_mask', ORANGE)
    _box(ax, (3.5, 0.55), 1.15, 1.3, 'Adam step\n(gradient\nnorm\nclipped)', BLUE)
    _arrow(ax, (3.0, 1.2), (3.5, 1.2))
    _arrow(ax, (4.05, 0.55), (1.6, 0.55), 'next minibatch', rad=-0.25, at=(2.83, 0.44),
           ha='center', va='center')
    _arrow(ax, (0.9, 2.25), (0.9, top), 'updated $\\pi_\\theta$: the next step\n'
           'samples with it', at=(1.02, 2.62), ha='left', va='center')
    return ax


# an informed episode on the task `product` (issue and read's output shortened to
# '…'): who wrote each token; the last call ends the episode, collate pads the row
_EPISODE = [('issue', 'env'), ('…', 'env'), ('<turn>', 'turn'), ('read', 'policy'),
            ('<end>', 'policy'), ('def', 'env'), ('…', 'env'), ('<turn>', 'turn'),
            ('edit', 'policy'), ('fix_init', 'policy'), ('<end>', 'policy'),
            ('code', 'env'), ('changed', 'env'), ('<turn>', 'turn'),
            ('submit', 'policy'), ('<end>', 'policy'), ('<pad>', 'pad'),
            ('<pad>', 'pad')]
_SOURCES = [(0, 2, 'issue\n(environment)'), (3, 4, 'call 1\n(policy)'),
            (5, 7, "read's output\n(environment)"), (8, 10, 'call 2\n(policy)'),
            (11, 13, "edit's answer\n(environment)"), (14, 15, 'call 3\n(policy)'),
            (16, 17, 'padding\n(collate)')]


def token_layout(ax=None):
    """One collated episode: tokens by author, action_mask and sample_logp [T-1]."""
    ax = _canvas(ax, 'token_layout')
    colors = dict(env=BLUE, turn=GREY, policy=ORANGE)
    widths = [max(0.3, 0.12 + 0.058 * len(word) + 0.04 * (kind in ('policy', 'pad')))
              for word, kind in _EPISODE]
    lefts = [1.0 + sum(widths[:j]) for j in range(len(widths))]
    for j, ((word, kind), x, w) in enumerate(zip(_EPISODE, lefts, widths)):
        pad = kind == 'pad'
        ax.add_patch(FancyBboxPatch((x, 2.0), w, 0.45, boxstyle='square,pad=0',
                                    facecolor='white' if pad
                                    else _tint(colors[kind], 0.35),
                                    edgecolor='0.8' if pad else 'white', linewidth=1.5,
                                    hatch='///' if pad else None))
        ax.text(x + w / 2, 2.225, word, ha='center', va='center', fontsize=SMALL,
                fontweight='bold' if kind == 'policy' else 'normal')
        if j == len(_EPISODE) - 1:
            break                                  # T tokens, T - 1 predictions
        mask = _EPISODE[j + 1][1] == 'policy'      # position j predicts token j + 1
        for y, text in ((1.3, str(int(mask))), (0.8, r'$\ell$' if mask else '0')):
            ax.add_patch(FancyBboxPatch((x, y), w, 0.4, boxstyle='square,pad=0',
                                        facecolor=_tint(ORANGE, 0.35) if mask
                                        else 'white', edgecolor='0.75', linewidth=0.8))
            ax.text(x + w / 2, y + 0.2, text, ha='center', va='center', fontsize=FONT,
                    color='black' if mask else '0.45')
        if mask:
            _arrow(ax, (x + w / 2, 1.72), (lefts[j + 1] + widths[j + 1] / 2, 1.98),
                   color=ORANGE)
    for first, last, text in _SOURCES:
        x0, x1 = lefts[first] + 0.03, lefts[last] + widths[last] - 0.03
        ax.plot([x0, x0, x1, x1], [2.53, 2.6, 2.6, 2.53], color='0.4', lw=0.9)
        ax.text((x0 + x1) / 2, 2.66, text, ha='center', va='bottom', fontsize=SMALL)
    for y, text in ((2.225, 'ids'), (1.5, 'action_mask'), (1.0, 'sample_logp')):
        ax.text(0.92, y, text, ha='right', va='center', fontsize=FONT)
    ax.text(1.0, 0.55, 'ids [T]; action_mask and sample_logp [T−1]: position $j$ '
            'scores the prediction of token $j+1$ (arrows).\naction_mask[$j$] = 1 when '
            "token $j+1$ is the policy's; sample_logp[$j$] = its log-prob $\\ell$ when "
            'it was sampled, 0 elsewhere.', ha='left', va='top', fontsize=SMALL)
    return ax


def three_policies(ax=None):
    """The three policies of one off-policy update, and train_async's loop."""
    ax = _canvas(ax, 'three_policies')
    ax.text(0.1, 5.35, 'in one update', fontsize=FONT, va='top', style='italic')
    _box(ax, (0.1, 3.95), 2.75, 1.1, 'behaviour policy $\\mu$ sampled the\n'
         'tokens: weights some updates old,\nor a sampler in another precision\n'
         '(BehaviorAgent); log-probs: sample_logp', ORANGE)
    _box(ax, (3.125, 3.95), 2.75, 1.1, r'proximal policy $\pi_{\mathrm{prox}}$: '
         "the learner's\nweights at the start of the update;\n"
         'log-probs: prox_logp, computed\nin prepare (Recomputed)', PURPLE)
    _box(ax, (6.15, 3.95), 2.75, 1.1, r"$\pi_\theta$, being updated: the learner's"
         '\nweights, scored again at every\nminibatch, with gradient', BLUE)
    for x0, x1, y in ((1.475, 4.45, 3.75), (4.55, 7.525, 3.75), (1.475, 7.525, 3.05)):
        ax.plot([x0, x0, None, x1, x1], [3.95, y, None, 3.95, y], color='0.4', lw=0.9)
        _arrow(ax, (x0, y), (x1, y), style='<|-|>')
    ax.text(2.96, 3.68, r'$w_t = \pi_{\mathrm{prox}}/\mu$ weights $A_t$ (Decoupled);'
            '\nTIS: $\\min(w_t, C)$; IcePop: 0 outside $[\\ell, h]$', ha='center',
            va='top', fontsize=SMALL)
    ax.text(6.04, 3.68, r'$\rho_t = \pi_\theta/\pi_{\mathrm{prox}}$, clipped to '
            r'$[1-\varepsilon_{\mathrm{low}}, 1+\varepsilon_{\mathrm{high}}]$'
            '\n(Decoupled; without $w_t$: Recomputed)', ha='center', va='top',
            fontsize=SMALL)
    ax.text(4.5, 2.98, "bypass (chapter 9's loop unchanged): ratio "
            r'$\pi_\theta/\mu$, the clip centred on $\mu$', ha='center', va='top',
            fontsize=SMALL)
    ax.plot([0.1, 8.9], [2.6, 2.6], color='0.75', lw=0.8)
    ax.text(0.1, 2.5, 'train_async: two processes', fontsize=FONT, va='top',
            style='italic')
    _box(ax, (0.1, 0.85), 2.75, 1.2, 'RolloutWorker (own process):\n'
         'sample_step s with the newest\nweights it holds, version v;\n'
         'waits while v < s − max_staleness', ORANGE)
    ax.text(4.5, 2.05, 'bounded queue (queue_size)', ha='center', va='bottom',
            fontsize=SMALL)
    for i, text in enumerate(('batch s + 1\nversion v′', 'batch s\nversion v')):
        _box(ax, (3.3 + 1.05 * i, 1.1), 0.95, 0.75, text, GREY, fontsize=SMALL)
    _box(ax, (6.15, 0.85), 2.75, 1.2, "learner (train_async): chapter 9's\n"
         'update on each batch, Decoupled\n(truncate=2.0) by default;\n'
         'staleness = s − v', BLUE)
    _arrow(ax, (2.85, 1.47), (3.3, 1.47))
    _arrow(ax, (5.3, 1.47), (6.15, 1.47), 'next_batch', at=(5.72, 1.55), ha='center',
           va='bottom')
    ax.plot([7.525, 7.525, 1.475], [0.85, 0.25, 0.25], color='0.3', lw=1.2)
    _arrow(ax, (1.475, 0.25), (1.475, 0.85))
    ax.text(4.5, 0.32, 'send(model, s + 1): the weights after every update, through a '
            'second queue;\nthe worker loads the newest before it samples a step, so '
            'its batches lag', ha='center', va='bottom', fontsize=SMALL)
    return ax


_REVERSE = r'$\mathrm{KL}(\pi_\theta\,\|\,\pi_{\mathrm{ref}})$'
_FORWARD = r'$\mathrm{KL}(\pi_{\mathrm{ref}}\,\|\,\pi_\theta)$'
_NEITHER = ("neither KL\n(verl's kl_penalty types)", GREY)
# per estimator: its value's properties, then (text, color) in the loss and the reward
_KL_ROWS = [('$k_1 = d$\nunbiased; can be negative',
             ('none: expected gradient 0\n(each sampled token is\nstill pushed down)',
              GREY),
             (f'reverse KL\n{_REVERSE}\ntrain_rl: $k_1$ summed over the episode',
              BLUE)),
            ('$k_2 = d^2/2$\nnever negative; biased',
             (f'reverse KL\n{_REVERSE}', BLUE), _NEITHER),
            ('$k_3 = e^{-d} - 1 + d$\nunbiased; never negative',
             (f'forward KL\n{_FORWARD}\nthe grpo preset ($\\beta$ = 0.04)', ORANGE),
             _NEITHER)]


def kl_estimators(ax=None):
    """Which divergence each KL estimator's expected gradient descends, per place."""
    ax = _canvas(ax, 'kl_estimators')
    columns = ((0.1, 2.8), (3.05, 2.8), (6.0, 2.9))
    headers = ('estimator at a sampled token,\n'
               '$d = \\log\\pi_\\theta - \\log\\pi_{\\mathrm{ref}}$',
               "in the loss\nkl_placement='loss'",
               "in the reward, as a number\nkl_placement='reward'")
    for (x, w), text in zip(columns, headers):
        _box(ax, (x, 3.15), w, 0.6, text, GREY, fill='0.92')
    for i, (estimator, *cells) in enumerate(_KL_ROWS):
        y = 2.3 - 0.85 * i
        _box(ax, (columns[0][0], y), columns[0][1], 0.75, estimator, GREY, fill='white')
        for (x, w), (text, color) in zip(columns[1:], cells):
            _box(ax, (x, y), w, 0.75, text, color)
    ax.text(0.1, 0.45, 'What the expected gradient descends on tokens sampled from '
            r'$\pi_\theta$ (on-policy). Multiplied by $\pi_\theta/\pi_{\mathrm{old}}$ '
            "before\ndifferentiating (TRL's default), $k_3$ in the loss descends the "
            'reverse KL.', ha='left', va='top', fontsize=SMALL)
    return ax


# chapter 12's hand-sized group on its two-bug task: the calls, the anchor state that
# MultiBugEnv logs before each (None: no other call of the group shares it), reward
_PLAYS = {'A': (['read', 'edit\nswap_minmax', 'edit\nfix_comparison', 'submit'],
                [0, 1, 2, 3], 1),
          'B': (['read', 'read', 'edit\nswap_minmax', 'edit\nfix_comparison', 'submit'],
                [0, 1, 1, 2, 3], 1),
          'C': (['read', 'edit\nswap_minmax', 'edit\nfix_index', 'submit'],
                [0, 1, 2, None], 0),
          'D': (['edit\nfix_index', 'edit\nswap_minmax', 'submit'], [0, None, None], 0)}
_STATE_COLORS = (BLUE, ORANGE, PURPLE, OLIVE)


def turn_credit(ax=None):
    """A group's calls, their anchor states, and the credit each objective gives A."""
    ax = _canvas(ax, 'turn_credit')
    column = [1.45 + 1.27 * c for c in range(5)]
    heads = [(x + 0.6, f'call {c + 1}') for c, x in enumerate(column)]
    for x, text in heads + [(8.35, 'reward'), (0.6, 'one group')]:
        ax.text(x, 5.45, text, ha='center', va='center', fontsize=SMALL, color='0.35')
    for r, (name, (calls, states, reward)) in enumerate(_PLAYS.items()):
        y = 4.75 - 0.55 * r
        ax.text(0.6, y + 0.24, name, ha='center', va='center', fontsize=10,
                fontweight='bold')
        for x, call, state in zip(column, calls, states):
            color = GREY if state is None else _STATE_COLORS[state]
            _box(ax, (x, y), 1.2, 0.48, call, color, fontsize=SMALL,
                 at=(x + 0.52, y + 0.24))
            if state is not None:
                ax.text(x + 1.08, y + 0.24, f'$s_{state}$', ha='center', va='center',
                        fontsize=FONT, fontweight='bold',
                        color=[0.6 * c for c in color])
        _box(ax, (7.85, y), 1.0, 0.48, f'R = {reward}', GREY,
             fill='0.92' if reward else 'white')
    ax.text(0.1, 2.8, '$s_0$ to $s_3$: the state before the call (what the agent saw '
            'last, the code, the edits used); calls with the same $s$\nform an anchor '
            'group. A call alone in its state (grey) gets a step advantage of 0.',
            va='top', fontsize=SMALL)
    ax.text(0.1, 2.25, 'the credit that reaches each call of A:', va='center',
            fontsize=SMALL, color='0.35')
    rows = [('episode\nObjective()', [r'$\hat A_A$'] * 4,
             r'$\hat A_A = (R_A - \mathrm{mean})/\mathrm{std}$' '\nover the group'),
            ('discounted\nDiscountedTurns($\\gamma$)',
             [r'$\gamma^3 R_A$', r'$\gamma^2 R_A$', r'$\gamma R_A$', '$R_A$'],
             r'$G_t = \gamma^{\,n-1-t} R_A$, whitened'
             '\nover all 16 calls of the group'),
            ('anchor states\nAnchorStates($\\gamma$, $\\omega$)',
             [f'$\\hat A_A + \\omega\\, a(s_{s})$' for s in range(4)],
             '$a(s)$: $G_t$ whitened among\nthe calls from state $s$')]
    for i, (label, cells, note) in enumerate(rows):
        y = 1.45 - 0.62 * i
        ax.text(0.1, y + 0.24, label, va='center', fontsize=SMALL)
        for x, cell in zip(column, cells):
            _box(ax, (x, y), 1.2, 0.48, cell, GREY, fill='white')
        ax.text(column[4], y + 0.24, note, va='center', fontsize=SMALL)
    return ax


def sweep_layout(ax=None):
    """python -m agentrl.sweep: runs as Ray tasks, a folder each, resumable."""
    ax = _canvas(ax, 'sweep_layout')
    _box(ax, (0.1, 4.5), 6.05, 0.65, 'python -m agentrl.sweep --out runs/presets \\\n'
         '    --presets default dapo gspo --seeds 0 1 2 --steps 80 --ray auto', GREY,
         fontsize=SMALL, fill='0.95', family='DejaVu Sans Mono', ha='left',
         at=(0.3, 4.825))
    ax.text(1.5, 4.2, 'presets × seeds: 9 runs', ha='center', va='center',
            fontsize=SMALL)
    finished = {('default', 0), ('default', 1), ('dapo', 0)}
    for r, preset in enumerate(('default', 'dapo', 'gspo')):
        for seed in range(3):
            done = (preset, seed) in finished
            _box(ax, (0.1 + 0.97 * seed, 3.35 - 0.68 * r), 0.9, 0.58,
                 f'{preset}\nseed {seed}' + (' ✓' if done else ''),
                 GREY if done else BLUE, fontsize=SMALL, fill='0.88' if done else None)
    ax.text(0.1, 1.82, '✓ finished before an interrupt:\nkept; the other 6 run',
            va='top', fontsize=SMALL)
    _frame(ax, (3.35, 1.25), 2.8, 2.9)
    ax.text(3.47, 4.05, 'train_many on Ray:\nexecutor=Writing(RayExecutor)', va='top',
            fontsize=SMALL, color=BLUE)
    _box(ax, (3.5, 3.05), 2.5, 0.52, 'object store: base agent, tasks,\n'
         'tokenizer (ray.put once)', GREY, fontsize=SMALL)
    for i, run in enumerate(('dapo-seed1', 'dapo-seed2', 'gspo-seed0', 'gspo-seed1')):
        _box(ax, (3.5 + 1.28 * (i % 2), 2.4 - 0.57 * (i // 2)), 1.22, 0.5,
             f'task: {run}\n1 CPU, 1 thread', BLUE, fontsize=SMALL)
    ax.text(4.75, 1.33, 'gspo-seed2 waits for a free CPU;\nwithout --ray: a LocalPool',
            ha='center', va='bottom', fontsize=SMALL, color=BLUE)
    _arrow(ax, (2.95, 2.7), (3.35, 2.7))
    tree = ('runs/presets/\n  sweep.json\n  default-seed0/\n  ...\n  dapo-seed1/\n'
            '    history.json\n    config.json\n    eval.json\n    policy.pt\n'
            '    curves.png\n  summary.csv\n  summary.png')
    _box(ax, (6.6, 1.25), 2.3, 2.9, tree, ORANGE, fontsize=SMALL,
         family='DejaVu Sans Mono', ha='left', at=(6.75, 2.7))
    _arrow(ax, (6.15, 2.7), (6.6, 2.7))
    ax.text(6.6, 4.22, 'as each run ends (ray.wait):\nwrite_run into '
            '.dapo-seed1.partial/,\nfsync, then rename into place', ha='left',
            va='bottom', fontsize=SMALL)
    _box(ax, (0.1, 0.1), 8.8, 0.85, 'resume: run the same command again. A run folder '
         'counts as finished only if its JSON files parse and\nits config.json names '
         "this sweep's preset, seed, steps, base seed and eval interval; finished runs "
         'are kept,\nthe others run again from step 0 (the sweep keeps no checkpoint '
         'inside a run)', GREY, fontsize=SMALL, fill='0.95')
    _arrow(ax, (7.75, 1.25), (7.75, 0.95))
    _arrow(ax, (1.5, 0.95), (1.5, 1.3))
    return ax
