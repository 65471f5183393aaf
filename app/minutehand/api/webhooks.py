"""A team's webhook: where its events (dead jobs, app/minutehand/api/dead.py) are
POSTed, signed with its secret (app/minutehand/maintenance/webhooks.py delivers them).

    PUT    /v1/teams/{name}/webhook              admin: set the URL (and secret)
    GET    /v1/teams/{name}/webhook              the URL and the delivery state (the team itself, or the admin)
    DELETE /v1/teams/{name}/webhook              admin: remove it
    GET    /v1/teams/{name}/webhook/deliveries   the newest delivery attempts (the team itself, or the admin)

The secret is shown once, in the answer to PUT; it is never read back.
"""
from __future__ import annotations

import secrets
from typing import Annotated

import msgspec
from litestar import delete, get, put
from litestar.di import NamedDependency
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, JSONBody, QueryParameter

from minutehand.api import problems
from minutehand.api.problems import COMMON
from minutehand.protocol.api import DeliveriesOut, DeliveryOut, WebhookIn, WebhookOut, WebhookSetOut
from minutehand.rules import secret_problem, url_problem
from minutehand.web.auth import Principal
from minutehand.web.context import Context
from minutehand.web.problems import FORBIDDEN, INVALID, NOT_FOUND, TOO_LARGE, ApiProblem

SECURITY = [{"bearer": []}]
TAGS = ["dead jobs"]
DELIVERIES_MAX = 500
WEBHOOK_BODY_BYTES = 8192


def routes(ctx: Context) -> list[HTTPRouteHandler]:
    store = ctx.store

    @put("/v1/teams/{name:str}/webhook", operation_id="setWebhook", status_code=200, security=SECURITY, tags=TAGS,
         request_max_body_size=WEBHOOK_BODY_BYTES, summary="Set a team's webhook (admin)",
         description="The team's events are POSTed to `url` in batches, signed with `secret` (header "
                     "`Minutehand-Signature`, docs/guides/dead-jobs.md), at least once, retried with exponential "
                     "backoff until a 2xx. A new webhook starts with the oldest events kept; a changed one "
                     "goes on where delivery was. The answer shows the secret, once.",
         responses=problems.responses(*COMMON, FORBIDDEN, NOT_FOUND, INVALID, TOO_LARGE))
    async def set_webhook(data: JSONBody[WebhookIn], principal: NamedDependency[Principal],
                          name: FromPath[str]) -> WebhookSetOut:
        principal.require_admin()
        secret = secrets.token_urlsafe(32) if data.secret is msgspec.UNSET else data.secret
        if reason := url_problem(data.url) or secret_problem(secret):
            raise ApiProblem(INVALID, reason)
        hook = await ctx.db(store.set_webhook, name, data.url, secret)
        return WebhookSetOut(hook.url, secret, hook.updated_at)

    @get("/v1/teams/{name:str}/webhook", operation_id="getWebhook", security=SECURITY, tags=TAGS,
         summary="A team's webhook and its delivery state",
         description="`failures`: failed attempts of the batch now being delivered; `next_attempt_at`: the "
                     "next try while backing off. `name`: the team, or `me`.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID))
    async def get_webhook(principal: NamedDependency[Principal], name: FromPath[str]) -> WebhookOut:
        team = principal.path_team(name)
        hook = await ctx.db(store.webhook, team)
        if hook is None:
            raise ApiProblem(NOT_FOUND, f"team {team!r} has no webhook")
        return WebhookOut(hook.url, hook.failures, hook.next_attempt_at, hook.updated_at)

    @delete("/v1/teams/{name:str}/webhook", operation_id="deleteWebhook", status_code=204, security=SECURITY,
            tags=TAGS, summary="Remove a team's webhook (admin)",
            responses=problems.responses(*COMMON, FORBIDDEN, NOT_FOUND, INVALID))
    async def delete_webhook(principal: NamedDependency[Principal], name: FromPath[str]) -> None:
        principal.require_admin()
        if not await ctx.db(store.delete_webhook, name):
            raise ApiProblem(NOT_FOUND, f"team {name!r} has no webhook")

    @get("/v1/teams/{name:str}/webhook/deliveries", operation_id="webhookDeliveries", security=SECURITY,
         tags=TAGS, summary="A team's newest webhook delivery attempts, newest first",
         description="Each attempt: when, the events it carried (ids first..last), the attempt number of its "
                     "batch, the receiver's status code or the error (timeout, refused connection, ...). Kept "
                     "7 days. `name`: the team, or `me`.",
         responses=problems.responses(*COMMON, NOT_FOUND, INVALID), exception_handlers=problems.parameters())
    async def webhook_deliveries(principal: NamedDependency[Principal], name: FromPath[str],
                                 limit: Annotated[int, QueryParameter(ge=1, le=DELIVERIES_MAX)] = 50
                                 ) -> DeliveriesOut:
        team = principal.path_team(name)
        if principal.is_admin and not await ctx.db(store.team_exists, team):
            raise ApiProblem(NOT_FOUND, f"no such team {team!r}")
        rows = await ctx.db(store.webhook_deliveries, team, limit=limit)
        return DeliveriesOut([DeliveryOut(d.at, d.url, d.events, str(d.first_event), str(d.last_event), d.attempt,
                                          d.status_code, d.error, d.duration_ms) for d in rows])

    return [set_webhook, get_webhook, delete_webhook, webhook_deliveries]
