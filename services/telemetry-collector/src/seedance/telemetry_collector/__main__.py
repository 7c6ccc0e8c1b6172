"""Entry point (filled in by the service's issue)."""


def main() -> None:
    raise SystemExit("not implemented yet")


if __name__ == "__main__":
    main()
