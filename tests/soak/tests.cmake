# The server's fault and load test: node drives mlxcel-server on the demo model over loopback
# with plain sockets (no packages needed); it bounds its own run well under the timeout, which
# sanitizer builds stretch (MLXCEL_TEST_TIME_SCALE, see TIME_SCALE).
mlxcel_node_test(soak/server_soak tests/soak/soak.test.mjs 120 RUN_SERIAL TRUE)
