// The runner of the native unit tests (tests/native/test_native_units.py builds and runs them): the one
// translation unit that compiles Boost.Test itself.
#define BOOST_TEST_MODULE gear_jax_native
#include <boost/test/included/unit_test.hpp>
