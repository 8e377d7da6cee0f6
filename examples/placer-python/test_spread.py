"""Unit tests of the spread policy, run without WebAssembly: ``python -m unittest``."""

import unittest
from types import SimpleNamespace as Record

import spread


def gpu(unit_id, domain=None, model=0, class_="gpu"):
    return Record(id=unit_id, class_=class_, model=model, nvlink_domain=domain, memory_gib=80)


def node(node_id, busy_units, free):
    return Record(id=node_id, busy_units=busy_units, total_units=8, domains=[], free=free)


def gpus(count, nvlink_all=False, model=0):
    entry = Record(class_="gpu", count=count, model=model, nvlink_all=nvlink_all)
    return Record(devices=[entry], spot=False, duration_seconds=3600, models=["H100"])


class SpreadTest(unittest.TestCase):
    def test_requests_go_to_the_least_busy_node(self):
        nodes = [node(1, 6, [gpu(0, 0), gpu(1, 0)]), node(2, 2, [gpu(2, 0), gpu(3, 0)])]
        self.assertEqual(spread.place(gpus(2), nodes), (2, [2, 3]))

    def test_equally_busy_nodes_go_to_the_lowest_id(self):
        nodes = [node(9, 1, [gpu(5)]), node(4, 1, [gpu(6)])]
        self.assertEqual(spread.place(gpus(1), nodes), (4, [6]))

    def test_a_less_busy_node_without_room_is_skipped(self):
        nodes = [node(1, 0, [gpu(0)]), node(2, 5, [gpu(1), gpu(2)])]
        self.assertEqual(spread.place(gpus(2), nodes)[0], 2)

    def test_nvlink_all_stays_inside_one_domain(self):
        free = [gpu(0, 0), gpu(1, 1), gpu(2, 1), gpu(3, 0), gpu(4, 1)]
        self.assertEqual(spread.place(gpus(3, nvlink_all=True), [node(1, 0, free)]), (1, [1, 2, 4]))
        with self.assertRaisesRegex(
            spread.Unschedulable,
            "^no node has room for 4 gpu units of model H100 in one NVLink domain$",
        ):
            spread.place(gpus(4, nvlink_all=True), [node(1, 0, free)])

    def test_class_and_model_are_respected(self):
        nodes = [node(1, 0, [gpu(0, model=1), gpu(1, class_="nic-vf"), gpu(2)])]
        self.assertEqual(spread.place(gpus(1), nodes), (1, [2]))
        with self.assertRaises(spread.Unschedulable):
            spread.place(gpus(2), nodes)

    def test_a_request_for_nothing_is_refused(self):
        with self.assertRaisesRegex(spread.Unschedulable, "asks for no devices"):
            spread.place(gpus(0), [node(1, 0, [gpu(0)])])


if __name__ == "__main__":
    unittest.main()
