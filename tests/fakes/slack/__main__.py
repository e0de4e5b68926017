"""`python -m tests.fakes.slack`: serve the fake until interrupted."""

from tests.fakes.slack import main

if __name__ == "__main__":
    main()
