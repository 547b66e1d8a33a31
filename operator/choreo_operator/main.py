"""Start kopf with the operator's registry, in the foreground, until SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import sys

import kopf

from choreo_operator.config import Config


def run(config: Config) -> int:
    from choreo_operator.handlers import Runtime, enable_webhook, registry

    logging.basicConfig(level=getattr(logging, config.log_level.upper(), logging.INFO),
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if config.webhook_port > 0:
        enable_webhook()
    memo = kopf.Memo(runtime=None)

    async def main() -> None:
        memo.runtime = Runtime(config)  # grpc.aio channels bind to the running loop
        await kopf.operator(registry=registry, clusterwide=True, standalone=True, memo=memo,
                            liveness_endpoint=config.liveness)

    asyncio.run(main())
    return 0
