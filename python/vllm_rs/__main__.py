"""`python -m vllm_rs serve [options]`: see `vllm_rs.serving.serve` (and `--help`)."""

import sys

USAGE = "usage: python -m vllm_rs serve [options]   (python -m vllm_rs serve --help for the options)"


def main(argv: list[str]) -> int:
    """Dispatches the subcommand; exit code 2 for a missing or unknown one."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] != "serve":
        print(f"python -m vllm_rs: error: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    from vllm_rs.serving.serve import main as serve_main

    return serve_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
