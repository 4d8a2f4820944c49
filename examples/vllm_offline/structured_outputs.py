"""vLLM examples/offline_inference/structured_outputs.py, import swapped: choice, regex, JSON schema and
grammar constraints through StructuredOutputsParams."""
import json

from octavo import LLM, SamplingParams
from octavo.structured_outputs import StructuredOutputsParams

CAR_SCHEMA = {"type": "object", "properties": {"brand": {"type": "string"}, "model": {"type": "string"},
                                               "car_type": {"type": "string",
                                                            "enum": ["sedan", "SUV", "Truck", "Coupe"]}},
              "required": ["brand", "model", "car_type"]}
GRAMMAR = """
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
"""
CASES = {
    "choice": (StructuredOutputsParams(choice=["Positive", "Negative"]),
               "Classify this sentiment: vLLM is wonderful!"),
    "regex": (StructuredOutputsParams(regex=r"\w+@\w+\.com\n"),
              "Generate an email address for Alan Turing, who works in Enigma. End in .com and new line."),
    "json": (StructuredOutputsParams(json=CAR_SCHEMA),
             "Generate a JSON with the brand, model and car_type of the most iconic car from the 90's"),
    "grammar": (StructuredOutputsParams(grammar=GRAMMAR),
                "Generate an SQL query to show the 'username' and 'email' from the 'users' table."),
}


def main():
    llm = LLM(max_model_len=512)
    for name, (so, prompt) in CASES.items():
        out = llm.generate(prompt, SamplingParams(max_tokens=60, temperature=0, structured_outputs=so),
                           use_tqdm=False)[0].outputs[0].text
        print(f"{name}: {out!r}")
        if name == "choice":
            assert out in ("Positive", "Negative")
        if name == "json":
            assert set(json.loads(out)) >= {"brand", "model", "car_type"}


if __name__ == "__main__":
    main()
