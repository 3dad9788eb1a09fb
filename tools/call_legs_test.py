"""Tests of call_legs: a round trip cut at its system calls."""
import io
import unittest

import call_legs

CALLER, CALLEE, CALLEE_TCP = 100, 200, 205


def trace(round_trips, start=1000.0):
    """perf script lines of `round_trips` calls, each leg 1 to 8 us long."""
    lines, t = [], start

    def event(pid, tid, name, arg=""):
        lines.append("%6d/%-6d %.6f: syscalls:%s: %s" % (pid, tid, t / 1e6,
                                                         name, arg))

    for _ in range(round_trips):
        event(CALLER, CALLER, "sys_enter_sendmsg", "fd: 0x11")
        t += 2
        event(CALLER, CALLER, "sys_exit_sendmsg", "0x81")
        event(CALLEE, CALLEE_TCP, "sys_exit_epoll_wait", "0x0")  # empty look
        t += 3
        event(CALLEE, CALLEE_TCP, "sys_exit_epoll_wait", "0x1")
        t += 1
        event(CALLEE, CALLEE_TCP, "sys_enter_recvfrom", "fd: 0x7")
        event(CALLEE, CALLEE_TCP, "sys_exit_recvfrom", "0x81")
        t += 8
        event(CALLEE, CALLEE_TCP, "sys_enter_sendmsg", "fd: 0x7")
        t += 4
        event(CALLEE, CALLEE_TCP, "sys_exit_sendmsg", "0x56")
        t += 5
        event(CALLER, CALLER, "sys_exit_poll", "0x1")
        t += 6
        event(CALLER, CALLER, "sys_enter_recvfrom", "fd: 0x11")
        event(CALLER, CALLER, "sys_exit_recvfrom", "0x56")
        t += 7
    # Another process's system calls are left out.
    event(300, 300, "sys_enter_sendmsg", "fd: 0x3")
    return lines


class SplitLegsTest(unittest.TestCase):

    def test_each_leg_of_each_round_trip(self):
        legs = call_legs.split_legs(call_legs.parse(trace(5)))
        expected = {"caller_send": 2, "hop_out": 3, "callee_wake": 1,
                    "callee_work": 8, "callee_send": 4, "hop_back": 5,
                    "caller_wake": 6, "caller_work": 7}
        for key, us in expected.items():
            # The last call's answer starts no next request.
            count = 4 if key == "caller_work" else 5
            self.assertEqual(len(legs[key]), count, key)
            for sample in legs[key]:
                self.assertAlmostEqual(sample, us, places=3, msg=key)

    def test_report_sums_the_medians(self):
        out = io.StringIO()
        call_legs.report(call_legs.split_legs(call_legs.parse(trace(5))),
                         out)
        self.assertIn("sum of the medians", out.getvalue())
        self.assertTrue(out.getvalue().rstrip().endswith("36.0"))

    def test_one_process_is_refused(self):
        lines = [l for l in trace(3) if "%d/" % CALLEE not in l[:14]]
        lines = [l for l in lines if not l.lstrip().startswith("300/")]
        with self.assertRaisesRegex(ValueError, "fewer than two"):
            call_legs.split_legs(call_legs.parse(lines))

    def test_a_caller_must_send_from_its_main_thread(self):
        lines = [l.replace("%6d/%-6d" % (CALLER, CALLER),
                           "%6d/%-6d" % (CALLER, CALLER + 1))
                 for l in trace(3)]
        with self.assertRaisesRegex(ValueError, "cannot tell the caller"):
            call_legs.split_legs(call_legs.parse(lines))


if __name__ == "__main__":
    unittest.main()
