//! The cluster bus's binary messages (Redis's `clusterMsg`), encoded and decoded.
