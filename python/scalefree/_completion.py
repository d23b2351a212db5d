"""``await completion`` for the one-sided operations' completions
(``scalefree._native.Completion.__await__`` calls :func:`wait_async`)."""

from __future__ import annotations

import asyncio


async def wait_async(completion) -> None:
    """Done at once if the operation already is; else its blocking ``wait`` runs in the
    running loop's default executor (without the interpreter lock), so the loop goes on."""
    if completion.test():
        completion.wait()
        return None
    await asyncio.get_running_loop().run_in_executor(None, completion.wait)
    return None
