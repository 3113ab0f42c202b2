"""One name for each thing: every public name of the library is used or named by the book
beyond its own definition, the names retired for their twins stay retired, and the symbols
the notation table replaced do not come back."""
import collections
import importlib
import re
from pathlib import Path

import pytest

import agentrl as arl

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / 'book').glob('[0-9][0-9]-*.md'))

# retired name -> the one name the book uses instead
RETIRED = {
    'episode_stats': 'behavior_stats (chapter 6)',
    'tasks_per_step': 'prompts_per_step',
    'samples_per_task': 'group_size',
    'blind_rate': 'multibug_blind_pass_rate (chapter 12)',
    'best_blind': 'best_blind_sequence (chapter 12)',
    'pass_at_k_product': 'arl.pass_at_k (the product form is chapter 17\'s #@demo)',
    'plugin_pass_at_k': 'chapter 17\'s #@demo, not a library estimator',
}
# names retired from the chapters' text as well (the other two live on as local
# demonstrations: chapter 4's best_blind table, chapter 17's product form)
RETIRED_IN_TEXT = ('episode_stats', 'tasks_per_step', 'samples_per_task', 'blind_rate')

# LaTeX the notation table (chapter 2, sec-notation) replaced: pattern -> what replaced it
RETIRED_SYMBOLS = {
    r'\\pi_\{\\text\{init\}\}': r'\pi_{\text{ref}}, the reference',
    r'q = \\pi_\\theta': r'\pi_\theta itself (q is no policy)',
    r'p = \\pi_\{\\text\{ref\}\}': r'\pi_{\text{ref}} itself',
    r'r\(x\) = \\frac\{p\(x\)\}\{q\(x\)\}': 'the log-ratio d (r is a reward)',
    r'w = e\^\{-d\}': 'e^{-d} written out (w is chapter 15\'s weight)',
    r'\\ell_t = \\log \\rho_t': r'd_t = -\log \rho_t (\ell is a loss term)',
}


def public_names():
    """Every name the package's tangled modules export -> [(module, name)]."""
    init = (ROOT / 'agentrl' / '__init__.py').read_text()
    modules = re.findall(r'^from \.(\w+) import \*', init, flags=re.M)
    return [(m, n) for m in modules for n in importlib.import_module(f'agentrl.{m}').__all__]


def unused_names(names, text):
    """Names that occur in text no more often than they are defined there -> [name].
    A use is a whole word (a maximal run of word characters); a definition is a def or
    class line, or an assignment at the start of a line. One pass over the text counts
    every word, so the cost does not grow with the number of names."""
    uses = collections.Counter(re.findall(r'\w+', text))
    definitions = collections.Counter(
        re.findall(r'^\s*(?:def|class)\s+(\w+)\b', text, flags=re.M)
        + re.findall(r'^(\w+)\s*(?:[:=]|,)', text, flags=re.M))
    return [name for name in names if uses[name] <= definitions[name]]


def book_text():
    return '\n'.join(p.read_text() for p in CHAPTERS)


def test_unused_names_finds_a_name_only_defined():
    text = 'def used(x):\n    pass\n\nused(1)\n\ndef orphan(x):\n    pass\n'
    assert unused_names(['used', 'orphan'], text) == ['orphan']
    assert unused_names(['LIMIT'], 'LIMIT = 3\n') == ['LIMIT']
    assert unused_names(['LIMIT'], 'LIMIT = 3\nprint(LIMIT)\n') == []


def test_every_public_name_is_used_or_named_beyond_its_definition():
    names = public_names()
    assert len(names) == len({n for _, n in names}), 'a public name exported twice'
    unused = unused_names([n for _, n in names], book_text())
    assert not unused, (f'public names the book never uses or names beyond their '
                        f'definition: {unused}; use them, name them, or make them '
                        f'private (_name) or #@demo')


@pytest.mark.parametrize('name', sorted(RETIRED))
def test_retired_names_are_gone_from_the_library(name):
    assert not hasattr(arl, name), f'arl.{name} is back; the book uses {RETIRED[name]}'
    for config in (arl.RLConfig, arl.PPOConfig):
        assert name not in config.__dataclass_fields__, (config.__name__, name)


@pytest.mark.parametrize('name', RETIRED_IN_TEXT)
def test_retired_names_are_gone_from_the_chapters(name):
    hits = [p.name for p in CHAPTERS if re.search(rf'(?<!\w){name}\b', p.read_text())]
    assert not hits, f'{name} appears in {hits}; the book uses {RETIRED[name]}'


@pytest.mark.parametrize('pattern', sorted(RETIRED_SYMBOLS))
def test_retired_symbols_are_gone_from_the_chapters(pattern):
    hits = [p.name for p in CHAPTERS if re.search(pattern, p.read_text())]
    assert not hits, f'{pattern} appears in {hits}; the notation is {RETIRED_SYMBOLS[pattern]}'


def test_notation_table_names_every_retired_symbols_replacement():
    table = (ROOT / 'book' / '02-rl-essentials.md').read_text()
    table = table[table.index('(sec-notation)='):]
    for symbol in (r'\pi_{\text{ref}}', r'\pi_{\text{old}}', '$d_t$', r'$\eta$',
                   '$k_1, k_2, k_3$', r'$\omega_{i,t}$'):
        assert symbol in table, f'the notation table lacks {symbol}'
