#!/usr/bin/env bash
# Registered in place of the UCX tests when meson found no UCX (libucx-dev): a skip that says so.
echo "skipped: libucx-dev is absent, so the UCX backend was not built (scripts/install-deps installs it)"
exit 77
