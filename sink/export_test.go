package sink

// InsertRun is insertRun, for the tests of package sink_test.
const InsertRun = insertRun
