"""The trainers' own configuration machinery, for checking agentrl's translations (test helper).

Install (3-5 s, ~8 MB of wheels; works in a plain venv too, no torch needed):
    pip install --no-deps verl==0.8.0 openrlhf==0.11.2
    pip install hydra-core==1.3.8        # + omegaconf 2.3.x, antlr4-python3-runtime==4.9.3
    (plain venv without system packages: also PyYAML and packaging, which hydra and
     omegaconf need; `pip install hydra-core` brings them itself)
verl_compose and openrlhf_parse/openrlhf_validate import none of verl's or OpenRLHF's
Python modules (so no torch, ray, tensordict, deepspeed, vllm, flash-attn): verl_compose
reads only the YAML in the verl wheel (verl/trainer/config), the way verl.trainer.main_ppo's
@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None) does;
the OpenRLHF helpers run only the statements of openrlhf/cli/train_ppo_ray.py's own
`if __name__ == "__main__":` block. Optional verl_actor_config needs more (see there).
"""
import argparse
import ast
import importlib.util
import os
import sys


def _package_dir(name):
    """The installed package's directory, found without importing the package."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f'{name} is not installed (pip install --no-deps {name})')
    return os.path.dirname(spec.origin)


def verl_config_dir():
    """verl/trainer/config inside the installed wheel."""
    return os.path.join(_package_dir('verl'), 'trainer', 'config')


def verl_compose(overrides=(), config_name='ppo_trainer', resolve=True):
    """Compose verl's trainer config with Hydra, exactly as `python -m
    verl.trainer.main_ppo key=value ...` does before it runs -> DictConfig.

    Raises hydra.errors.ConfigCompositionException on an unknown key (the config is in
    struct mode; a new key needs Hydra's '+key=value') or an unparsable value; with
    resolve=True also resolves every interpolation (${oc.select:...}, ${...}) once, so a
    broken interpolation raises too."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    if resolve:
        OmegaConf.to_container(cfg, resolve=True)
    return cfg


def _openrlhf_source():
    path = os.path.join(_package_dir('openrlhf'), 'cli', 'train_ppo_ray.py')
    with open(path) as f:
        return path, f.read()


def _openrlhf_main_block():
    """The statements of train_ppo_ray.py's `if __name__ == "__main__":` block, split at
    `args = parser.parse_args()` -> (path, before, after)."""
    path, source = _openrlhf_source()
    tree = ast.parse(source, path)
    blocks = [node for node in tree.body if isinstance(node, ast.If)
              and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"']
    if len(blocks) != 1:
        raise RuntimeError(f'{path}: expected one `if __name__ == "__main__":` block')
    body = blocks[0].body
    for i, stmt in enumerate(body):
        if 'parser.parse_args()' in ast.unparse(stmt):
            return path, body[:i], body[i + 1:]
    raise RuntimeError(f'{path}: no `args = parser.parse_args()` in its __main__ block')


def _run(path, statements, namespace):
    exec(compile(ast.Module(body=list(statements), type_ignores=[]), path, 'exec'),
         namespace)


def _stdlib_namespace(path):
    """The module's top-level imports of standard-library modules (argparse, os,
    datetime), run for real; its other imports (ray, openrlhf.trainer..., which pull in
    torch, deepspeed, vllm) are not run: the parser statements do not use them."""
    tree = ast.parse(_openrlhf_source()[1], path)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
               and all((getattr(node, 'module', None) or alias.name).split('.')[0]
                       in sys.stdlib_module_names for alias in node.names)]
    namespace = {'__name__': 'openrlhf_train_ppo_ray_parser'}
    _run(path, imports, namespace)
    return namespace


def openrlhf_parser():
    """OpenRLHF's own argparse parser for `python -m openrlhf.cli.train_ppo_ray`
    (openrlhf 0.11.2). The module builds it inside `if __name__ == "__main__":` after
    top-level imports of ray and openrlhf.trainer.ray (-> vllm, deepspeed, torch), so
    neither importing the module nor running it with --help works without those; here
    the block's statements before `parser.parse_args()` are executed from the installed
    source (with ast), after only its standard-library imports -> ArgumentParser."""
    path, before, _ = _openrlhf_main_block()
    namespace = _stdlib_namespace(path)
    _run(path, before, namespace)
    parser = namespace.get('parser')
    if not isinstance(parser, argparse.ArgumentParser):
        raise RuntimeError(f'{path}: the __main__ block built no `parser`')
    parser.prog = 'python -m openrlhf.cli.train_ppo_ray'
    return parser


def openrlhf_parse(flags):
    """Parse flags with OpenRLHF's own train_ppo_ray parser -> argparse.Namespace with
    dotted dests (getattr(ns, 'algo.kl.init_coef')). An unknown flag, a value of the
    wrong type or outside `choices` prints argparse's error and raises SystemExit(2)."""
    return openrlhf_parser().parse_args(list(flags))


def openrlhf_validate(flags):
    """openrlhf_parse, then the rest of the __main__ block as OpenRLHF runs it (its
    `hierarchize` and its asserts and fix-ups), stopping before `train(args)` and the
    ModelScope patch -> the nested SimpleNamespace train(args) would get. A combination
    OpenRLHF rejects raises its AssertionError."""
    path, _, after = _openrlhf_main_block()
    namespace = _stdlib_namespace(path)
    namespace['args'] = openrlhf_parse(flags)
    config = os.path.join(_package_dir('openrlhf'), 'utils', 'config.py')
    spec = importlib.util.spec_from_file_location('_openrlhf_utils_config', config)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)   # stdlib only (types.SimpleNamespace)
    namespace['hierarchize'] = module.hierarchize
    keep = [stmt for stmt in after
            if not isinstance(stmt, (ast.Import, ast.ImportFrom))
            and ast.unparse(stmt) not in ('train(args)',)
            and not ast.unparse(stmt).startswith('if args.use_ms')]
    _run(path, keep, namespace)
    return namespace['args']
