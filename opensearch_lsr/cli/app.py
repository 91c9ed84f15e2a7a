"""The root `lsr-os` click group and the helpers every command module shares.

Each command only parses options, calls the library and prints. Errors: every deliberate library error
derives from :class:`opensearch_lsr.errors.LsrError`; configuration dataclasses raise ``ValueError``
(listing the allowed values) and missing inputs ``FileNotFoundError``. :func:`user_errors` turns exactly
these into one ``Error: ...`` line (``click.ClickException``); anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

import click

from .. import __version__
from ..errors import LsrError

if TYPE_CHECKING:  # ray_job needs the 'ray' extra: imported when --engine ray runs
    from ..encoding.ray_job import RayOptions

__all__ = ["cli", "compile_setting", "echo_json", "fail", "user_errors", "error_message", "typed_options",
           "refuse_cluster_options", "ray_options", "RAY_OPTIONS", "USER_ERRORS"]

#: What a command reports as one line instead of a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (LsrError, ValueError, FileNotFoundError)


def echo_json(payload: Any) -> None:
    """Print ``payload`` as indented JSON (non-ASCII kept, unknown objects via ``str``)."""
    click.echo(json.dumps(payload, ensure_ascii=False, indent=2, default=str))


def typed_options(ctx: click.Context, names: Any) -> list[str]:
    """Which of the parameters ``names`` were typed on the command line (not defaults, not the environment), as
    their flags."""
    flags = {p.name: next((o for o in p.opts if o.startswith("--")), p.opts[0]) for p in ctx.command.params}
    return [flags[n] for n in names if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]


#: the cluster connection options (:func:`opensearch_lsr.opensearch.client.connection_options`)
CLUSTER_OPTIONS = ("url", "user", "password", "ca_certs", "insecure", "aws_region", "aws_service", "request_timeout",
                   "max_retries")


def refuse_cluster_options(backend: str, *, offline: tuple[str, ...] = ("local",)) -> None:
    """Connection options typed with a backend that reaches no cluster (``offline``) are an error, not ignored."""
    if backend in offline:
        given = typed_options(click.get_current_context(), CLUSTER_OPTIONS)
        if given:
            fail(f"{', '.join(given)} connect{'s' if len(given) == 1 else ''} to a cluster, but --backend is "
                 f"{backend}: add --backend opensearch (or elasticsearch)")


#: ``lsr-os index``'s ``--engine ray`` options (the fields of :class:`opensearch_lsr.encoding.ray_job.RayOptions`)
RAY_OPTIONS = ("workers", "address", "num_gpus_per_worker", "cpus_per_worker", "calls_per_worker")


def ray_options(engine: str, values: dict[str, Any]) -> RayOptions | None:
    """With ``--engine ray``, the job's ``RayOptions`` from ``values`` (the parsed options by name); with another
    engine ``None``, after refusing any Ray option typed on the command line (it would be ignored)."""
    if engine != "ray":
        given = typed_options(click.get_current_context(), RAY_OPTIONS)
        if given:
            fail(f"{', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with --engine ray")
        return None
    from ..encoding.ray_job import RayOptions

    return RayOptions(**{name: values[name] for name in RAY_OPTIONS})


def compile_setting(scope: str | None, no_compile: bool) -> bool | str | None:
    """``--compile [SCOPE]`` / ``--no-compile`` as the encoder's ``compile`` takes it (``None``: its default)."""
    if scope and no_compile:
        fail("--compile and --no-compile contradict each other: pick one")
    return False if no_compile else scope


def fail(message: str) -> NoReturn:
    """Exit with one clear sentence instead of a traceback."""
    raise click.ClickException(message)


def error_message(err: BaseException, *, first_line: bool = False) -> str:
    """The sentence shown for ``err``: its ``reason`` (OpenSearch-like errors) or its text."""
    text = getattr(err, "reason", None) or str(err) or type(err).__name__
    return text.splitlines()[0] if first_line else text


@contextlib.contextmanager
def user_errors(*, first_line: bool = False) -> Iterator[None]:
    """Turn a :data:`USER_ERRORS` error raised inside the block into one ``Error:`` line."""
    try:
        yield
    except USER_ERRORS as err:
        fail(error_message(err, first_line=first_line))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="lsr-os")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """Build target-language (Korean first) learned sparse encoders and run them on OpenSearch.

    \b
    Flow: transfer -> (train) -> export -> deploy-model -> create-index/create-pipeline
          -> index -> search -> eval.   `lsr-os quickstart` runs the whole chain locally.
    """
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
