"""A FastAPI application that keeps its people as JSON files through tether's asyncio API.

``PUT /people/{handle}`` records a durable job that writes ``people/<handle>.json`` and answers
once the job is committed (202, with its id); a worker performs it. ``GET /people/{handle}``
reads the file. No handler waits on the database or the disk in the event loop: the async store
runs those on its own threads.

Run it (``pip install fastapi uvicorn`` beside tether), with a worker in a second terminal:

    TETHER_DB=sqlite:///app.db TETHER_ROOT=data uvicorn examples.fastapi_app:app
    .venv/bin/tether --db sqlite:///app.db worker

tests/test_aio.py drives it with FastAPI's test client, a worker running beside it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel

from tether import AsyncCoordinator, AsyncJsonStore
from tether.store import ModelNotFound


class Person(BaseModel):
    handle: str
    email: str


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # The ledger and data root come from $TETHER_DB and $TETHER_ROOT, as for the command line.
    async with await AsyncCoordinator.open() as coordinator:
        app.state.store = AsyncJsonStore(coordinator)
        yield


app = FastAPI(lifespan=lifespan)


def store_of(request: Request) -> AsyncJsonStore:
    store: AsyncJsonStore = request.app.state.store
    return store


@app.put("/people/{handle}", status_code=202)
async def save_person(handle: str, person: Person, request: Request) -> dict[str, str]:
    if person.handle != handle:
        raise HTTPException(422, f"the body's handle {person.handle!r} is not the path's {handle!r}")
    result = await store_of(request).save(f"people/{handle}.json", person)
    return {"job": result.id}


@app.get("/people/{handle}")
async def get_person(handle: str, request: Request) -> Person:
    try:
        return await store_of(request).load(f"people/{handle}.json", Person)
    except ModelNotFound as e:
        raise HTTPException(404, f"no person {handle!r} yet (saved people appear once a worker ran the job)") from e
