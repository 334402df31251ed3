#![no_main]
// SPDX-License-Identifier: AGPL-3.0-or-later
libfuzzer_sys::fuzz_target!(|data: &[u8]| metatopia_node::fuzzing::genesis(data));
