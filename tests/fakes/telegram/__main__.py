"""`python -m tests.fakes.telegram`: serve the fake until interrupted."""

from tests.fakes.telegram import main

if __name__ == "__main__":
    main()
