"""`Store.open` on both backends: `create=False` never creates a database, and a database
that a newer Herald migrated is refused with what to do, before anything is written."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from gateway.contracts.errors import SetupError
from gateway.store import Store
from gateway.store import engine as engine_mod

pytestmark = pytest.mark.timeout(60)

FUTURE = "9999_from_the_future"


async def test_create_false_refuses_a_database_without_herald(store_url: str) -> None:
    with pytest.raises(SetupError, match="nothing was ever stored there"):
        async with Store.open(store_url, create=False):
            pass

    # Still nothing there: the default open migrates from the very first revision.
    async with Store.open(store_url) as store:
        assert await engine_mod.current_revision(store.engine) == engine_mod.head_revision()


async def test_create_false_opens_an_existing_database(store_url: str) -> None:
    async with Store.open(store_url):
        pass

    async with Store.open(store_url, create=False) as store:
        assert await engine_mod.current_revision(store.engine) == engine_mod.head_revision()


async def stamp_future(store_url: str) -> None:
    """Leave the database as a newer Herald would: at a revision this code does not ship."""
    async with Store.open(store_url) as store, store.engine.begin() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": FUTURE})


async def test_a_database_newer_than_the_code_is_refused(store_url: str) -> None:
    await stamp_future(store_url)

    with pytest.raises(SetupError) as caught:
        async with Store.open(store_url):
            pass

    message = str(caught.value)
    assert message.startswith("this database (")
    assert f"was upgraded by a newer Herald (revision {FUTURE}; " in message
    assert message.endswith("upgrade Herald or restore a backup")


async def test_without_migrating_a_newer_database_opens_and_is_unknown(store_url: str) -> None:
    await stamp_future(store_url)

    async with Store.open(store_url, migrate=False) as store:
        current = await engine_mod.current_revision(store.engine)

    assert current == FUTURE
    assert not engine_mod.known_revision(FUTURE)
