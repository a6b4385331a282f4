#!/usr/bin/env bash
# One GPU: four served rounds of 2,048 requests (108 + 128 at 256 streams) on the tree of k116,
# each against bench engine on the same requests, with the worker's step log.
source scripts/gpu/session.sh
STEP_LOG=1 served 4
finish
