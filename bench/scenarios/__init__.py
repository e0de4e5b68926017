"""One module per benchmark scenario; each has `NAME`, `TITLE` and `async def run(ctx)`."""
